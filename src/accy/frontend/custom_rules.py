"""`custom_jvp`, `custom_vjp`, `custom_gradient` and `custom_vmap`: front-end functions of
trees with derivative (or batching) rules of their own, spelled as JAX's (`f.defjvp(rule)`,
`f.defjvps(...)`, `f.defvjp(fwd, bwd)`, `f.def_vmap(rule)`).

Under a trace, each call becomes one `accy.CustomCall` per output leaf, whose operands are the
array leaves of the arguments, then the values the function closed over, then the values of
enclosing traces that only the rules close over. Every record runs by composition on every
device (its `fallback` is the traced function, which the native backends inline and the
reference evaluator runs), so no kernel is written; its derivative is the user's rule, traced
once per signature into a Program and inlined where it is needed:

- `custom_jvp`: the record's JVP rule runs the traced `rule(primals, tangents)` and takes this
  leaf's tangent (with `symbolic_zeros=True`, the rule is traced per pattern of tangents known
  to be zero, which it sees as `SymbolicZero`s and may return); reverse mode transposes it
  (so the rule must be linear in the tangents, as JAX requires; a custom function the rule
  applies to tangents is transposed through its body).
- `custom_vjp`: under reverse mode the primal output is `fwd`'s (the record's `forward`
  rule), as JAX runs `fwd` under differentiation; the record's VJP rule recomputes the
  residuals with the traced `fwd`, then pulls this leaf's cotangent (zeros for the other
  leaves) back through the traced `bwd`; the leaves' contributions add up, since `bwd` is
  linear in the cotangent. `bwd` may give None for any subtree of an argument (zeros). With
  `symbolic_zeros=True`, fwd is traced per pattern of perturbed arguments (the records'
  `perturbed=` flags), and bwd per pattern and output leaf, the others' cotangents being
  `SymbolicZero`s.
  Forward mode differentiates the function itself.
- `custom_gradient`: a `custom_vjp` whose residuals are the arguments.
- `custom_vmap`: the record's batching rule runs the traced `rule(axis_size, in_batched,
  *args)` on the whole batch. Its tangent is a call of its own (the function's JVP), whose
  batching rule is the JVP of the rule, as JAX's: under vmap a tangent is the rule's
  derivative (the primal stays the call's); reverse mode transposes it.
  `sequential_vmap` is one without a rule: vmap calls it once per example.
- `closure_convert`: a function's closed-over traced values as extra arguments, so that a
  rule (given the converted function as a nondiff argument) differentiates them.

Under `accy.vmap`, a `custom_jvp`/`custom_vjp` call becomes one call of the function mapped
over the axis, whose rules are the rules mapped the same way (an argument not mapped gets
its cotangent summed over the examples), so the batched call keeps its custom derivative; a
call that reads values it closed over runs once per example instead, in a scan.

Outside any trace a call just runs the function. Arguments are resolved to positions as JAX
does (keyword-only ones passed are an error). Arguments that are not arrays (Python numbers,
strings; and the `nondiff_argnums`/`nondiff_argnames`) are static: they key the signature,
and their tangents and cotangents are None. Values the function or only its rules close over
are constants to the rules (their derivative through the call is zero), as JAX treats
`nondiff_argnums`; rules may close over concrete arrays and over values of open traces.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import optree

from ..core import Program, Value
from ..core.kinds.registry import Zero
from ..custom import CustomCall, lookup, register
from ..errors import AccyError
from ..reference import run as reference_run
from ..transforms.linearize import linearize
from ..transforms.unroll import apply as unroll
from .errors import TransformError
from .functions import _check_callable, _name
from .named import NamedArray, named_scalar
from .tracing import (
    NAMESPACE,
    Traced,
    flatten,
    innermost,
    innermost_trace,
    is_array,
    static_key,
    structure,
    trace,
    unflatten,
)
from .vmap import vmap

_COUNTER = itertools.count()


def _signature_of(fn: Callable) -> inspect.Signature | None:
    if isinstance(fn, functools.partial):  # opaque, as JAX treats it: positional arguments
        return inspect.signature(lambda *args, **kwargs: None)
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature
        return None


def _positional(fn: Callable, kind: str, signature: Any, args: tuple, kwargs: dict) -> tuple:
    """`args` and `kwargs` as positional arguments of `fn` (whose `signature` it is, or None),
    as JAX resolves them: missing arguments and keyword-only ones are errors."""
    if signature is None:
        return args + tuple(kwargs.values())
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError as error:
        raise TransformError(
            f"the arguments to the accy.{kind} function {_name(fn)}{signature} do not match "
            f"it: {error}"
        ) from None
    bound.apply_defaults()
    passed = [k for k in bound.kwargs if k in kwargs]
    if passed:
        raise TransformError(
            f"the arguments to the accy.{kind} function {_name(fn)}{signature}: the keyword "
            f"arguments {', '.join(passed)} cannot be passed by position, as the rules get "
            "the arguments; make them positional parameters"
        )
    return tuple(bound.args)


def _closure_inputs(what: str, traced: Traced, ops: Any, closed: list, operands: list) -> list:
    """What a rule closed over, as values of `ops`: concrete arrays as constants, and values of
    an enclosing trace that the function itself closed over (`closed`) as the call's operands
    standing for them (`operands`); any other traced value is an error."""
    values = []
    for captured in traced.captured:
        if isinstance(captured, NamedArray):
            values.append(ops.constant(np.asarray(captured), captured.ty))
            continue
        position = next((k for k, c in enumerate(closed) if c is captured), None)
        if position is None:
            raise AccyError(
                f"{what} closes over a traced value ({captured.ty}) that the function does not "
                "use; a derivative rule may use its arguments, what the function closes over, "
                "and concrete arrays: pass the value as an argument"
            )
        values.append(operands[position])
    return values


class _Signature:
    """What one call signature of a custom function traced to: the function's Program and its
    CustomCall records (one per output leaf)."""

    def __init__(self, owner: Any, args: tuple, leaves: list[Any], treedef: Any):
        self.owner = owner
        self.args = args
        self.leaves = leaves
        self.treedef = treedef
        self.arrays = [i for i, leaf in enumerate(leaves) if is_array(leaf)]
        fn = owner.fn
        self.traced = trace(lambda *a: fn(*_unwrapped(a)), leaves, treedef, _name(fn))
        self.program: Program = self.traced.program
        self.out_treedef = self.traced.out_treedef
        self.rule_programs: dict[Any, Any] = {}
        self.symbolic_outputs: dict[str, list[int]] = {}  # jvp rule name -> SymbolicZero leaves
        self.batched_calls: dict[tuple, Traced] = {}  # (axis, extent, batched) -> mapped call
        self.batched_calls_under_way: set[tuple] = set()
        self.tangent_records: dict[int, CustomCall] = {}  # a custom_vmap's tangent calls
        self.prepared = False
        # Values of enclosing traces that the rules close over and the function does not:
        # extra operands of the call, after the function's captures (JAX lets a bwd close
        # over a traced value).
        self.extra: list[Any] = []
        tag = f"accy.{owner.kind}.{_name(owner.fn)}.{next(_COUNTER)}"
        self.records = [
            CustomCall(
                f"{tag}.{j}",
                1,
                result_type=self.program.output_types[j],
                reference=functools.partial(self._reference, j),
                fallback=functools.partial(self._fallback, j),
                kernels={"cpu": _decline, "cuda": _decline},
                **owner.rule_for(self, j),
            )
            for j in range(len(self.program.outputs))
        ]

    @property
    def closed(self) -> list[Any]:
        """What the call's operands after the arguments' arrays stand for."""
        return [*self.traced.captured, *self.extra]

    def _fallback(self, j: int, *values: Any) -> Any:
        used = list(values[: len(self.program.parameters)])  # not the rules' extra operands
        outputs = values[0].builder.call(self.program, used)
        return outputs[j] if isinstance(outputs, tuple) else outputs

    def _reference(self, j: int, *arrays: Any) -> Any:
        return reference_run(self.program, list(arrays[: len(self.program.parameters)]))[j]

    def note_rule_captures(self) -> None:
        """Collect what the traced rules close over beyond the function's captures."""
        for traced in self.rule_programs.values():
            for value in traced.captured:
                if isinstance(value, Value) and not any(value is c for c in self.closed):
                    self.extra.append(value)

    def primal_trees(self, values: Sequence[Any]) -> tuple:
        """The positional arguments with the array leaves replaced by `values` (the others, the
        static ones, as given)."""
        leaves = list(self.leaves)
        for position, value in zip(self.arrays, values, strict=False):
            leaves[position] = value
        return unflatten(self.treedef, leaves)[0]

    def batched_stand_ins(self, axis: str, extent: int, batched: Sequence[bool]) -> list:
        """Stand-ins for the array leaves, those that `batched` marks with `axis` first."""
        parameters = [self.leaves[i] for i in self.arrays]
        return [
            NamedArray(None, p.ty.with_axes(((axis, extent), *p.ty.named_extents)), "reference")
            if b
            else p
            for p, b in zip(parameters, batched, strict=True)
        ]

    def batched_flags(self, batched: Sequence[bool]) -> list:
        """`batched` (one flag per array leaf) as one tree of flags per positional argument,
        False for the static leaves."""
        flags = [False] * len(self.leaves)
        for position, b in zip(self.arrays, batched, strict=True):
            flags[position] = b
        return list(unflatten(self.treedef, flags)[0])

    def tangent_trees(self, values: Sequence[Any]) -> tuple:
        """Like `primal_trees`, with None for the static leaves."""
        leaves: list[Any] = [None] * len(self.leaves)
        for position, value in zip(self.arrays, values, strict=False):
            leaves[position] = value
        return unflatten(self.treedef, leaves)[0]

    def emit(self, builder: Any, leaves: list[Any]) -> Any:
        for record in self.records:  # registered again if the table was reset meanwhile
            if lookup(record.target, record.version) is not record:
                register(record, replace=True)
        operands = [builder.lift(leaves[i]) for i in self.arrays]
        operands += [builder.lift(c) for c in self.closed]
        outputs = [record.call(builder, *operands) for record in self.records]
        return unflatten(self.out_treedef, outputs)


def _decline(operand_types: Any, result_type: Any) -> None:
    """The kernel function of every record: none, so the backends inline the fallback."""
    return None


class _CustomFunction:
    """What `custom_jvp` and `custom_vjp` share: calls, signatures, `nondiff_argnums`."""

    kind = "custom"

    def __init__(self, fn: Callable, nondiff_argnums: Sequence[int], nondiff_argnames=()):
        _check_callable(fn, self.kind)
        self.fn = fn
        self._signature = _signature_of(fn)
        positions = set(nondiff_argnums) | set(_positions_of(fn, nondiff_argnames, self.kind))
        self.nondiff_argnums = tuple(sorted(positions))  # the rules get them in this order
        self._signatures: dict[tuple, _Signature] = {}
        self._preparing = False
        functools.update_wrapper(self, fn, updated=())

    def __getattr__(self, name: str) -> Any:
        # Forwarded to the decorated function, so that stacked decorators keep each other's
        # methods (`custom_vmap(custom_jvp(f)).defjvp`), as JAX's.
        fn = self.__dict__.get("fn")
        if fn is None:
            raise AttributeError(name)
        return getattr(fn, name)

    def _require_rules(self) -> None:
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args = _positional(self.fn, self.kind, self._signature, args, kwargs)
        self._require_rules()
        for n in self.nondiff_argnums:
            if not -len(args) <= n < len(args):
                raise TransformError(
                    f"accy.{self.kind}: nondiff_argnums names argument {n}, but "
                    f"{_name(self.fn)} was called with {len(args)} arguments"
                )
        static = {n % len(args) for n in self.nondiff_argnums}
        # Python floats are f32 arguments with tangents, as JAX traces them; nondiff arguments
        # are static, their arrays too.
        args = tuple(
            _Static(a) if i in static else optree.tree_map(_float_as_array, a, namespace=NAMESPACE)
            for i, a in enumerate(args)
        )
        leaves, treedef = flatten((args, {}))
        key = (treedef, tuple(leaf.ty if is_array(leaf) else static_key(leaf) for leaf in leaves))
        signature = self._signatures.get(key)
        if signature is None:
            signature = _Signature(self, args, leaves, treedef)
            if not signature.traced.foreign:  # closed over nothing of a trace: reusable
                self._signatures[key] = signature
        # The call belongs to the innermost trace among its arguments and what the function
        # closed over (a vmapped value it closes over, next to an argument from around vmap).
        candidates = [leaf for leaf in leaves if is_array(leaf)] + signature.traced.captured
        outer = innermost(candidates)
        if outer is None:  # nothing is traced: no derivative to customize
            return self.fn(*_unwrapped(args))
        # The rules are traced now, while the traces they may close over are open; a rule
        # that fails here (the user's code may raise anything) is traced again, and its error
        # raised, only when it is differentiated: JAX never runs a rule it does not need.
        if not signature.prepared and not self._preparing:  # not again for the function
            signature.prepared = self._preparing = True  # that the rule itself calls
            try:
                with contextlib.suppress(Exception):
                    self.prepare(signature)
            finally:
                self._preparing = False
            signature.note_rule_captures()
            if signature.extra:  # the rules read values of open traces: not reusable
                self._signatures.pop(key, None)
                outer = innermost(candidates + signature.extra)
        return signature.emit(outer, leaves)

    def prepare(self, signature: _Signature) -> None:
        raise NotImplementedError

    def rule_for(self, signature: _Signature, j: int) -> dict[str, Any]:
        raise NotImplementedError

    def _trace_rule(self, signature: _Signature, name: str, rule: Callable, trees: tuple):
        """Trace `rule(*trees)` (trees of traced values and static leaves), once per signature."""
        found = signature.rule_programs.get(name)
        ended = [
            c for c in signature.closed if getattr(getattr(c, "builder", None), "finished", False)
        ]
        if found is None and ended:
            raise TransformError(
                f"the {self.kind} rule of {_name(self.fn)!r} is traced only now, as it is "
                f"differentiated (a call made inside another rule is not traced ahead), but "
                f"{_name(self.fn)!r} closes over a value of the trace {ended[0].builder.name!r}, "
                "which has ended (JAX raises UnexpectedTracerError here): pass the value as an "
                "argument"
            )
        if found is None:
            leaves, treedef = flatten((trees, {}))
            found = signature.rule_programs[name] = trace(
                lambda *t: rule(*t), leaves, treedef, f"{name}_{_name(self.fn)}"
            )
        return found

    def _nondiff(self, signature: _Signature) -> tuple:
        return tuple(_unwrapped(signature.args)[n] for n in self.nondiff_argnums)

    def batched(self, axis: str, flags: list) -> _CustomFunction:
        """The function mapped over `axis` (on the leaves that `flags` marks, per positional
        argument tree), with its rules mapped the same way: another custom function."""
        raise NotImplementedError

    def _batch_mapped(self, signature: _Signature, j: int, e: Any, operands, batched, axis):
        """vmap of a call: one call of the mapped function (whose rules are the mapped rules,
        so the call keeps its custom derivative); None (one call per example, in a scan) when
        the call reads values it closed over."""
        count = len(signature.arrays)
        if len(operands) > count or getattr(self, "symbolic_zeros", False):
            return None  # closed-over operands, or rules that see symbolic zeros: per example
        extent = next(x.ty.extent(axis) for x, b in zip(operands, batched, strict=True) if b)
        key = (axis, extent, tuple(batched))
        traced = signature.batched_calls.get(key)
        if traced is None and key in signature.batched_calls_under_way:
            return None  # the mapped rules call the function itself: that call loops
        if traced is None:
            signature.batched_calls_under_way.add(key)
            try:
                traced = self._batched_call(signature, axis, extent, batched)
            finally:
                signature.batched_calls_under_way.discard(key)
            if traced is None:
                return None
            signature.batched_calls[key] = traced
        outputs = e.call(traced.program, list(operands))
        return outputs[j] if isinstance(outputs, tuple) else outputs

    def _batched_call(self, signature: _Signature, axis: str, extent: int, batched) -> Any:
        """The mapped function traced on the batched arguments (None if it reads values of a
        trace: then one call per example instead)."""
        mapped = self.batched(axis, signature.batched_flags(batched))
        stand_ins = signature.batched_stand_ins(axis, extent, batched)
        leaves, treedef = flatten((signature.primal_trees(stand_ins), {}))
        name = f"vmap_{_name(self.fn)}"
        traced = trace(lambda *t: mapped(*_unwrapped(t)), leaves, treedef, name)
        return None if traced.captured else traced

    def _mapped(self, fn: Callable, axis: str, flags: list) -> Callable:
        """`fn` mapped over `axis`: its nondiff arguments closed over, the others mapped where
        `flags` (one tree per positional argument) marks them."""
        nondiff = set(self.nondiff_argnums)

        def mapped(*args: Any) -> Any:
            diff = [i for i in range(len(args)) if i not in nondiff]

            def per_example(*values: Any) -> Any:
                full = list(args)
                for i, v in zip(diff, values, strict=True):
                    full[i] = v
                return fn(*full)

            in_axes = tuple(_in_axes(flags[i]) for i in diff)
            return vmap(per_example, axis, in_axes=in_axes)(*(args[i] for i in diff))

        return mapped


def _summed_where_unmapped(cotangent: Any, flags: Any, axis: str) -> Any:
    """`cotangent` (a tree, or None) summed over `axis` at the leaves `flags` marks unmapped."""
    if cotangent is None:
        return None
    return optree.tree_map(
        lambda c, f: c if f or c is None else c.sum(axis),
        cotangent,
        flags,
        is_leaf=lambda x: x is None,
        namespace=NAMESPACE,
    )


def _in_axes(flags: Any) -> Any:
    """vmap's in_axes for an argument tree from its tree of batched flags."""
    return optree.tree_map(lambda b: True if b else None, flags, namespace=NAMESPACE)


def _positions_of(fn: Callable, names: Sequence[str], kind: str) -> list[int]:
    """The positions of the parameters of `fn` called `names` (JAX's `nondiff_argnames`)."""
    if isinstance(names, str):
        names = (names,)
    if not names:
        return []
    parameters = list(inspect.signature(fn).parameters)
    missing = [n for n in names if n not in parameters]
    if missing:
        raise TransformError(
            f"accy.{kind}: nondiff_argnames names {missing}, but {_name(fn)} has the "
            f"parameters {parameters}"
        )
    return [parameters.index(n) for n in names]


class SymbolicZero:
    """A tangent known to be zero, given to a `custom_jvp` rule defined with
    `symbolic_zeros=True` (JAX's `jax.custom_derivatives.SymbolicZero`): it has the type of
    the value it is the tangent of, and the rule may return it as a tangent.

    >>> import accy
    >>> z = SymbolicZero(accy.spec(accy.f32, n=2))
    >>> z, z.shape, z.dtype
    (SymbolicZero(f32[n=2]), {'n': 2}, accy.f32)
    """

    __slots__ = ("ty",)

    def __init__(self, ty: Any):
        self.ty = ty

    @property
    def shape(self) -> dict[str, int]:
        return dict(self.ty.named_extents)

    @property
    def dtype(self) -> Any:
        return self.ty.dtype

    def __repr__(self) -> str:
        return f"SymbolicZero({self.ty})"


def zero_from_primal(x: Any, symbolic_zeros: bool = False) -> Any:
    """A zero tangent for each leaf of the tree `x`: `SymbolicZero`s with `symbolic_zeros`
    (for a `custom_jvp` rule defined with them to return), else zero arrays
    (`jax.custom_derivatives.zero_from_primal`).

    >>> import accy, numpy as np
    >>> accy.zero_from_primal(accy.named(np.ones(2, np.float32), "n"), symbolic_zeros=True)
    SymbolicZero(f32[n=2])
    """

    def zero(leaf: Any) -> Any:
        if not is_array(leaf):
            raise TransformError(f"zero_from_primal: {leaf!r} is not an array")
        if symbolic_zeros:
            return SymbolicZero(leaf.ty)
        if isinstance(leaf, NamedArray):
            return NamedArray(np.zeros(leaf.array.shape, leaf.array.dtype), leaf.ty, leaf.device)
        return _zeros_of(leaf.ty)

    return optree.tree_map(zero, x, namespace=NAMESPACE)


def _instantiated(leaf: Any) -> Any:
    return _zeros_of(leaf.ty) if isinstance(leaf, SymbolicZero) else leaf


def _zeros_of(ty: Any) -> Any:
    """Zeros of type `ty`, in the trace under way."""
    return innermost_trace().full(ty, 0.0)


def _zeros_like(x: Any) -> Any:
    """Zeros of the type of the traced value `x`, in the trace under way."""
    return (innermost_trace() or x.builder).full(x.ty, 0.0)


def _float_as_array(leaf: Any) -> Any:
    return named_scalar(leaf) if type(leaf) is float else leaf


class _Static:
    """A nondiff argument, kept whole as one static leaf (its arrays are not traced)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __hash__(self) -> int:
        return id(self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and other.value is self.value


def _unwrapped(args: tuple) -> tuple:
    return tuple(a.value if isinstance(a, _Static) else a for a in args)


def _differentiable_part(trees: tuple, static: set[int]) -> tuple:
    """The positional argument trees without the nondiff ones (what the rules see)."""
    return tuple(t for i, t in enumerate(trees) if i not in static)


class CustomJvp(_CustomFunction):
    """The function behind `accy.custom_jvp(fn)`; give its rule with `defjvp`."""

    kind = "custom_jvp"

    def __init__(self, fn: Callable, nondiff_argnums: Sequence[int] = (), nondiff_argnames=()):
        super().__init__(fn, nondiff_argnums, nondiff_argnames)
        self.jvp_rule: Callable | None = None
        self.symbolic_zeros = False

    def defjvp(self, rule: Callable, symbolic_zeros: bool = False) -> Callable:
        """Set the JVP rule `rule(primals, tangents) -> (primal_out, tangent_out)` (with
        `nondiff_argnums`, `rule(*nondiff, primals, tangents)`); returns `rule`, so it works as
        a decorator, as JAX's. With `symbolic_zeros`, a tangent known to be zero comes as a
        `SymbolicZero` (the rule is traced once per pattern of them), and the rule may return
        one."""
        _check_callable(rule, "custom_jvp.defjvp")
        self.jvp_rule = rule
        self.symbolic_zeros = bool(symbolic_zeros)
        self._signatures.clear()
        return rule

    def defjvps(self, *rules: Callable | None) -> None:
        """One JVP rule per positional argument, `rule(tangent, primal_out, *primals) ->
        tangent_out` (None: the output does not depend on that argument); the output's tangent
        is their sum, as JAX's `defjvps`.

        >>> import accy
        >>> @accy.custom_jvp
        ... def f(x, y):
        ...     return x.sin() * y
        >>> f.defjvps(lambda x_dot, out, x, y: x.cos() * x_dot * y,
        ...           lambda y_dot, out, x, y: x.sin() * y_dot)
        >>> round(accy.grad(f, argnums=1)(1.0, 2.0).item(), 4)
        0.8415
        """
        if self.nondiff_argnums:
            raise TransformError(
                f"accy.custom_jvp function {_name(self.fn)!r}: defjvps cannot be used with "
                "nondiff_argnums; write one rule with defjvp"
            )
        for rule in rules:
            if rule is not None:
                _check_callable(rule, "custom_jvp.defjvps")

        def jvp(primals: tuple, tangents: tuple) -> tuple:
            if len(rules) != len(primals):
                raise TransformError(
                    f"custom_jvp.defjvps of {_name(self.fn)!r} got {len(rules)} rules for "
                    f"{len(primals)} arguments; give one rule (or None) per argument"
                )
            out = self(*primals)
            terms = [
                rule(t, out, *primals)
                for rule, t in zip(rules, tangents, strict=True)
                if rule is not None and t is not None
            ]
            total = (
                functools.reduce(
                    lambda a, b: optree.tree_map(lambda x, y: x + y, a, b, namespace=NAMESPACE),
                    terms,
                )
                if terms
                else optree.tree_map(lambda x: x * 0.0, out, namespace=NAMESPACE)
            )
            return out, total

        self.defjvp(jvp)

    def _require_rules(self) -> None:
        if self.jvp_rule is None:
            raise TransformError(
                f"accy.custom_jvp function {_name(self.fn)!r} has no JVP rule; define it with "
                "@f.defjvp before calling f"
            )

    def rule_for(self, signature: _Signature, j: int) -> dict[str, Any]:
        return {
            "jvp": functools.partial(self._jvp, signature, j),
            "symbolic_zeros": self.symbolic_zeros,
            "batch": functools.partial(self._batch_mapped, signature, j),
        }

    def batched(self, axis: str, flags: list) -> CustomJvp:
        mapped = CustomJvp(self._mapped(self.fn, axis, flags), self.nondiff_argnums)
        rule, count = self.jvp_rule, len(self.nondiff_argnums)

        def mapped_rule(*args: Any) -> Any:
            nondiff, (primals, tangents) = args[:count], args[count:]

            def per_example(p: Any, t: Any) -> Any:
                pair = rule(*nondiff, p, t)  # a SymbolicZero it gives becomes zeros here
                if isinstance(pair, tuple | list) and len(pair) == 2:
                    pair = (pair[0], optree.tree_map(_instantiated, pair[1], namespace=NAMESPACE))
                return pair

            return vmap(per_example, axis)(primals, tangents)

        mapped.defjvp(mapped_rule, symbolic_zeros=False)
        return mapped

    def prepare(self, signature: _Signature) -> None:
        # With symbolic zeros the rule is traced when differentiated, once the tangents known
        # to be zero are known (so it may close over the traces open then, not earlier ones).
        if not self.symbolic_zeros:
            self._jvp_program(signature)

    def _jvp_program(self, signature: _Signature, zeros: tuple = ()) -> Traced:
        """The rule traced on this signature's primals and tangents, checked; with symbolic
        zeros, `zeros` says which argument leaves' tangents are `SymbolicZero`s."""
        static = {n % len(signature.args) for n in self.nondiff_argnums}
        nondiff = self._nondiff(signature)
        rule = self.jvp_rule
        symbolic: list[int] = []  # the tangent_out leaves the rule gave as SymbolicZero

        def run_rule(primal_trees: tuple, tangent_trees: tuple) -> Any:
            p = _differentiable_part(primal_trees, static)
            t = _differentiable_part(tangent_trees, static)
            pair = rule(*nondiff, p, t)
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise TransformError(
                    f"the custom_jvp rule of {_name(self.fn)!r} must return a pair "
                    f"(primal_out, tangent_out), got {type(pair).__name__}"
                )
            leaves, treedef = flatten(pair[1])
            symbolic.extend(k for k, leaf in enumerate(leaves) if isinstance(leaf, SymbolicZero))
            leaves = [
                _zeros_of(leaf.ty) if isinstance(leaf, SymbolicZero) else leaf for leaf in leaves
            ]
            return pair[0], unflatten(treedef, leaves)

        parameters = [signature.leaves[i] for i in signature.arrays]
        tangents = [
            SymbolicZero(p.ty) if zero else p
            for p, zero in zip(parameters, zeros or [False] * len(parameters), strict=True)
        ]
        name = f"jvp{''.join('0' if z else '1' for z in zeros)}" if any(zeros) else "jvp"
        known = name in signature.rule_programs
        traced = self._trace_rule(
            signature,
            name,
            run_rule,
            (signature.primal_trees(parameters), signature.tangent_trees(tangents)),
        )
        if not known:
            signature.symbolic_outputs[name] = symbolic
        out_def, tangent_def = traced.out_treedef.children()
        for what, got in (("primal_out", out_def), ("tangent_out", tangent_def)):
            if got != signature.out_treedef:
                raise TransformError(
                    f"the custom_jvp rule of {_name(self.fn)!r} returned a {what} of structure "
                    f"{got}, but the function returns {signature.out_treedef}"
                )
        count = out_def.num_leaves
        got_types = list(traced.program.output_types[:count])
        expected_types = list(signature.program.output_types)
        if got_types != expected_types:
            raise TransformError(
                f"the custom_jvp rule of {_name(self.fn)!r} returned a primal_out of types "
                f"({', '.join(map(str, got_types))}), but the function returns "
                f"({', '.join(map(str, expected_types))}); they must be the same"
            )
        return traced

    def _jvp(self, signature: _Signature, j: int, e: Any, primals, tangents, result) -> Any:
        count = len(signature.arrays)
        zeros = tuple(isinstance(t, Zero) for t in tangents[:count]) if self.symbolic_zeros else ()
        traced = self._jvp_program(signature, zeros)
        name = f"jvp{''.join('0' if z else '1' for z in zeros)}" if any(zeros) else "jvp"
        if j in signature.symbolic_outputs.get(name, ()):
            return Zero(signature.program.output_types[j])
        constants = _closure_inputs(
            f"the custom_jvp rule of {_name(self.fn)!r}",
            traced,
            e,
            signature.closed,
            list(primals[count:]),
        )
        given = [e.instantiate(t) for t in tangents[:count] if not (zeros and isinstance(t, Zero))]
        arguments = [*primals[:count], *given, *constants]
        outputs = e.call(traced.program, arguments)
        outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
        tangent = outputs[len(signature.records) + j]
        expected = signature.program.output_types[j]
        if tangent.ty != expected:
            raise TransformError(
                f"the custom_jvp rule of {_name(self.fn)!r} gave a tangent {tangent.ty} for an "
                f"output {expected}; they must have the same type"
            )
        return tangent


class CustomVjp(_CustomFunction):
    """The function behind `accy.custom_vjp(fn)`; give its rules with `defvjp`."""

    kind = "custom_vjp"

    def __init__(self, fn: Callable, nondiff_argnums: Sequence[int] = (), nondiff_argnames=()):
        super().__init__(fn, nondiff_argnums, nondiff_argnames)
        self.fwd: Callable | None = None
        self.bwd: Callable | None = None
        self.symbolic_zeros = False

    def defvjp(self, fwd: Callable, bwd: Callable, symbolic_zeros: bool = False) -> None:
        """Set the rules: `fwd(*args) -> (output, residuals)` and `bwd(residuals, cotangent) ->
        one cotangent tree (or None) per argument` (with `nondiff_argnums`, `bwd(*nondiff,
        residuals, cotangent)` and one per differentiable argument), as JAX's.

        With `symbolic_zeros`, as JAX's: each array leaf of a differentiable argument comes to
        `fwd` as a `CustomVJPPrimal` (`.value`, and `.perturbed`: whether it is being
        differentiated; fwd is traced once per pattern of them), and an output leaf whose
        cotangent is known to be zero comes to `bwd` as a `SymbolicZero`, which bwd may also
        return (as None). accy pulls each output leaf's cotangent back by a `bwd` call of its
        own, the other leaves' cotangents then being `SymbolicZero`s.

        >>> import accy, numpy as np
        >>> @accy.custom_vjp
        ... def scale(x, y):
        ...     return x * y
        >>> def fwd(x, y):
        ...     print("perturbed:", x.perturbed, y.perturbed)
        ...     return scale(x.value, y.value), (x.value, y.value)
        >>> def bwd(res, g):
        ...     x, y = res
        ...     return g * y, g * x
        >>> scale.defvjp(fwd, bwd, symbolic_zeros=True)
        >>> two = accy.named(np.float32(2.0), ())
        >>> accy.grad(lambda x: scale(x, two))(two).item()
        perturbed: True False
        2.0
        """
        _check_callable(fwd, "custom_vjp.defvjp (fwd)")
        _check_callable(bwd, "custom_vjp.defvjp (bwd)")
        self.fwd, self.bwd = fwd, bwd
        self.symbolic_zeros = bool(symbolic_zeros)
        self._signatures.clear()

    def _require_rules(self) -> None:
        if self.fwd is None:
            raise TransformError(
                f"accy.custom_vjp function {_name(self.fn)!r} has no rules; define them with "
                "f.defvjp(fwd, bwd) before calling f"
            )

    def rule_for(self, signature: _Signature, j: int) -> dict[str, Any]:
        return {
            "vjp": functools.partial(self._vjp, signature, j),
            "forward": functools.partial(self._forward, signature, j),
            "batch": functools.partial(self._batch_mapped, signature, j),
            "symbolic_zeros": self.symbolic_zeros,
        }

    def batched(self, axis: str, flags: list) -> CustomVjp:
        mapped = CustomVjp(self._mapped(self.fn, axis, flags), self.nondiff_argnums)
        bwd, count = self.bwd, len(self.nondiff_argnums)
        diff_flags = [f for i, f in enumerate(flags) if i not in set(self.nondiff_argnums)]

        def mapped_bwd(*args: Any) -> Any:
            nondiff, (residuals, cotangent) = args[:count], args[count:]
            pulled = vmap(lambda r, g: tuple(bwd(*nondiff, r, g)), axis)(residuals, cotangent)
            # An argument that was not mapped gets the sum over the examples.
            return tuple(
                _summed_where_unmapped(c, f, axis) for c, f in zip(pulled, diff_flags, strict=False)
            )

        mapped.defvjp(self._mapped(self.fwd, axis, flags), mapped_bwd)
        return mapped

    def prepare(self, signature: _Signature) -> None:
        # With symbolic zeros the rules are traced when differentiated, once the perturbed
        # arguments are known.
        if not self.symbolic_zeros:
            self._vjp_programs(signature)

    def _vjp_programs(self, signature: _Signature, perturbed=None, j: int | None = None) -> tuple:
        """fwd and bwd traced on this signature, checked: (fwd, the structure of its output,
        bwd, which bwd output is each argument leaf's cotangent). With symbolic zeros, for the
        pattern `perturbed` (one flag per array leaf of the arguments), and bwd for output
        leaf `j` alone (the others' cotangents `SymbolicZero`s; no bwd without `j`)."""
        static = {n % len(signature.args) for n in self.nondiff_argnums}
        nondiff = self._nondiff(signature)
        name = _name(self.fn)
        fwd, bwd = self.fwd, self.bwd
        parameters = [signature.leaves[i] for i in signature.arrays]
        symbolic = self.symbolic_zeros
        pattern = "".join("1" if p else "0" for p in perturbed) if symbolic else ""

        def run_fwd(primal_trees: tuple) -> Any:
            if symbolic:
                primal_trees = _vjp_primals(primal_trees, static, perturbed)
            pair = fwd(*_unwrapped(primal_trees))
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise TransformError(
                    f"the custom_vjp fwd of {name!r} must return a pair (output, residuals), "
                    f"got {type(pair).__name__}"
                )
            return tuple(pair)

        forward = self._trace_rule(
            signature, f"fwd{pattern}", run_fwd, (signature.primal_trees(parameters),)
        )
        out_def, residual_def = forward.out_treedef.children()
        if out_def != signature.out_treedef:
            raise TransformError(
                f"the custom_vjp fwd of {name!r} returned an output of structure {out_def}, "
                f"but the function returns {signature.out_treedef}"
            )
        out_types = signature.program.output_types
        if symbolic and j is None:  # fwd alone: bwd is traced per output leaf
            return forward, out_def, None, None

        def run_bwd(residual_leaves: list, cotangent_leaves: list) -> Any:
            res = unflatten(residual_def, residual_leaves)
            if symbolic:  # the one cotangent leaf j, SymbolicZeros for the others
                cotangent_leaves = [
                    cotangent_leaves[0] if k == j else SymbolicZero(t)
                    for k, t in enumerate(out_types)
                ]
            ct = unflatten(signature.out_treedef, cotangent_leaves)
            cotangents = bwd(*nondiff, res, ct)
            if not isinstance(cotangents, tuple | list):
                raise TransformError(
                    f"the custom_vjp bwd of {name!r} must return a tuple with one cotangent per "
                    f"differentiable argument, got {type(cotangents).__name__}"
                )
            return (
                tuple(_symbolic_as_none(c) for c in cotangents) if symbolic else tuple(cotangents)
            )

        residual_types = forward.program.output_types[out_def.num_leaves :]
        stand_ins = [NamedArray(None, t, "reference") for t in residual_types]
        given_types = [out_types[j]] if symbolic else out_types
        ct_stand_ins = [NamedArray(None, t, "reference") for t in given_types]
        bwd_name = f"bwd{pattern}.{j}" if symbolic else "bwd"
        backward = self._trace_rule(signature, bwd_name, run_bwd, (stand_ins, ct_stand_ins))
        diff_trees = _differentiable_part(signature.primal_trees(parameters), static)
        expected = structure(tuple(diff_trees))
        returned = backward.out_treedef
        cotangents_by_leaf = self._cotangent_leaves(signature, backward, returned, expected)
        return forward, out_def, backward, cotangents_by_leaf

    def _perturbed(self, signature: _Signature, perturbed: Sequence[bool] | None) -> tuple:
        """The flags of the arguments' array leaves among a call's operand flags (None without
        symbolic zeros)."""
        if not self.symbolic_zeros:
            return None
        return tuple(perturbed[: len(signature.arrays)])

    def _run_fwd(
        self, signature: _Signature, e: Any, primals: list, perturbed=None
    ) -> tuple[list, list]:
        """fwd on the call's operands: (its output leaves, its residual leaves)."""
        count = len(signature.arrays)
        forward, out_def, _, _ = self._vjp_programs(signature, perturbed)
        closed, operands = signature.closed, list(primals[count:])
        what = f"the custom_vjp fwd of {_name(self.fn)!r}"
        constants = _closure_inputs(what, forward, e, closed, operands)
        outputs = e.call(forward.program, [*primals[:count], *constants])
        outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
        return outputs[: out_def.num_leaves], outputs[out_def.num_leaves :]

    def _forward(self, signature: _Signature, j: int, e: Any, primals: list, perturbed=None) -> Any:
        """Output leaf `j` as fwd computes it: the primal under reverse mode, as in JAX."""
        perturbed = self._perturbed(signature, perturbed)
        output = self._run_fwd(signature, e, primals, perturbed)[0][j]
        expected = signature.program.output_types[j]
        if output.ty != expected:
            raise TransformError(
                f"the custom_vjp fwd of {_name(self.fn)!r} returned an output leaf {output.ty} "
                f"where the function returns {expected}; they must have the same type"
            )
        return output

    def _vjp(
        self, signature: _Signature, j: int, e: Any, primals, result, cotangent, perturbed=None
    ) -> list:
        count = len(signature.arrays)
        name = _name(self.fn)
        perturbed = self._perturbed(signature, perturbed)
        _, _, backward, cotangents_by_leaf = self._vjp_programs(signature, perturbed, j)
        closed, operands = signature.closed, list(primals[count:])
        residuals = self._run_fwd(signature, e, primals, perturbed)[1]
        out_types = signature.program.output_types
        if self.symbolic_zeros:
            cts = [cotangent]
        else:
            cts = [e.zeros(t) if k != j else cotangent for k, t in enumerate(out_types)]
        constants = _closure_inputs(
            f"the custom_vjp bwd of {name!r}", backward, e, closed, operands
        )
        pulled = e.call(backward.program, [*residuals, *cts, *constants])
        pulled = list(pulled) if isinstance(pulled, tuple) else [pulled]
        result_cts: list[Any] = []
        for position in range(count):
            index = cotangents_by_leaf[position]
            result_cts.append(None if index is None else pulled[index])
        for position, ct in enumerate(result_cts):
            if ct is not None and ct.ty != primals[position].ty:
                raise TransformError(
                    f"the custom_vjp bwd of {name!r} gave a cotangent {ct.ty} for an argument "
                    f"leaf {primals[position].ty}; they must have the same type"
                )
        return result_cts + [None] * (len(primals) - count)

    def _cotangent_leaves(self, signature, backward, returned, expected) -> list[int | None]:
        """For each array leaf of the arguments: which output of the traced bwd is its
        cotangent (None: bwd gave None for its argument, or it is a nondiff one)."""
        name = _name(self.fn)
        static = {n % len(signature.args) for n in self.nondiff_argnums}
        diff_positions = [i for i in range(len(signature.args)) if i not in static]
        pieces = list(backward.output) if isinstance(backward.output, tuple) else None
        if pieces is None or len(pieces) != len(diff_positions):
            raise TransformError(
                f"the custom_vjp bwd of {name!r} must return a tuple with one cotangent per "
                f"differentiable argument ({len(diff_positions)}), got {returned}"
            )
        by_argument: dict[int, list[int | None]] = {}
        next_output = 0
        for position, piece in zip(diff_positions, pieces, strict=True):
            argument = signature.args[position]
            given = _given_leaves(piece, argument, f"the custom_vjp bwd of {name!r}", position)
            by_argument[position] = []
            for leaf, has_value in zip(flatten(argument)[0], given, strict=True):
                if has_value:
                    next_output += 1  # the traced bwd's outputs skip the Nones
                if is_array(leaf):
                    by_argument[position].append(next_output - 1 if has_value else None)
        order: list[int | None] = []
        for position, argument in enumerate(signature.args):
            count = len([leaf for leaf in flatten(argument)[0] if is_array(leaf)])
            order += by_argument.get(position, [None] * count)
        return order


class CustomVJPPrimal:
    """An array leaf of a differentiable argument as a `custom_vjp` fwd defined with
    `symbolic_zeros=True` gets it (JAX's `jax.custom_derivatives.CustomVJPPrimal`): its
    `value`, and whether it is `perturbed` (differentiated: its tangent is not known to be
    zero).

    >>> import accy, numpy as np
    >>> p = accy.CustomVJPPrimal(accy.named(np.float32(1.0), ()), perturbed=False)
    >>> p.value.item(), p.perturbed
    (1.0, False)
    """

    __slots__ = ("value", "perturbed")

    def __init__(self, value: Any, perturbed: bool):
        self.value, self.perturbed = value, perturbed

    def __repr__(self) -> str:
        return f"CustomVJPPrimal({self.value!r}, perturbed={self.perturbed})"


def custom_vjp_primal_tree_values(tree: Any) -> Any:
    """`tree` with each `CustomVJPPrimal` leaf replaced by its value
    (`jax.custom_derivatives.custom_vjp_primal_tree_values`).

    >>> import accy
    >>> accy.custom_vjp_primal_tree_values({"a": accy.CustomVJPPrimal(2.0, True)})
    {'a': 2.0}
    """
    return optree.tree_map(
        lambda leaf: leaf.value if isinstance(leaf, CustomVJPPrimal) else leaf,
        tree,
        namespace=NAMESPACE,
    )


def _vjp_primals(primal_trees: tuple, static: set[int], perturbed: Sequence[bool]) -> tuple:
    """The differentiable arguments with each leaf a `CustomVJPPrimal` (array leaves flagged by
    `perturbed`, in order; static leaves never perturbed); nondiff arguments as they are."""
    flags = iter(perturbed)

    def wrap(leaf: Any) -> Any:
        return CustomVJPPrimal(leaf, bool(next(flags)) if is_array(leaf) else False)

    return tuple(
        tree if i in static else optree.tree_map(wrap, tree, namespace=NAMESPACE)
        for i, tree in enumerate(primal_trees)
    )


def _symbolic_as_none(cotangent: Any) -> Any:
    """A bwd's cotangent tree with its `SymbolicZero` leaves as None (zeros)."""
    return optree.tree_map(
        lambda leaf: None if isinstance(leaf, SymbolicZero) else leaf,
        cotangent,
        namespace=NAMESPACE,
    )


def _given_leaves(piece: Any, argument: Any, what: str, position: int) -> list[bool]:
    """For each leaf of `argument`: whether `piece`, its cotangent tree, gives it a value; a
    None in `piece` stands for zeros of the whole subtree there, as in JAX."""
    given: list[bool] = []

    def visit(part: Any, subtree: Any) -> None:
        leaves = flatten(subtree)[0]
        if part is not None and (len(leaves) != 1 or structure(subtree).num_nodes != 1):
            raise ValueError  # a leaf of the cotangent where the argument has a subtree
        given.extend([part is not None] * len(leaves))

    try:  # tree_map_ builds no tree: a registered node never sees None children
        optree.tree_map_(visit, piece, argument, is_leaf=lambda x: x is None, namespace=NAMESPACE)
    except (ValueError, TypeError):
        raise TransformError(
            f"{what} returned for argument {position} a tree of structure {structure(piece)}, "
            f"but the argument has {structure(argument)} (None may stand for any subtree)"
        ) from None
    return given


def custom_jvp(
    fn: Callable | None = None,
    *,
    nondiff_argnums: Sequence[int] = (),
    nondiff_argnames: Sequence[str] = (),
) -> Any:
    """`fn` with a forward-mode rule of its own (`jax.custom_jvp`): decorate, then give the
    rule with `@f.defjvp`; reverse mode transposes the rule.

    >>> import accy, numpy as np
    >>> @accy.custom_jvp
    ... def safe_log1p_exp(x):
    ...     return (x.exp() + 1.0).log()
    >>> @safe_log1p_exp.defjvp
    ... def _(primals, tangents):
    ...     (x,), (t,) = primals, tangents
    ...     return safe_log1p_exp(x), t * x.logistic()
    >>> x = accy.named(np.array([0.0, 100.0], np.float32), "n")
    >>> accy.grad(lambda x: safe_log1p_exp(x).sum())(x).array.tolist()
    [0.5, 1.0]
    """
    if fn is None:
        return functools.partial(
            custom_jvp, nondiff_argnums=nondiff_argnums, nondiff_argnames=nondiff_argnames
        )
    return CustomJvp(fn, nondiff_argnums, nondiff_argnames)


def custom_vjp(
    fn: Callable | None = None,
    *,
    nondiff_argnums: Sequence[int] = (),
    nondiff_argnames: Sequence[str] = (),
) -> Any:
    """`fn` with a reverse-mode rule of its own (`jax.custom_vjp`): decorate, then give
    `f.defvjp(fwd, bwd)`.

    >>> import accy, numpy as np
    >>> @accy.custom_vjp
    ... def clip_gradient(x):
    ...     return x
    >>> def fwd(x):
    ...     return x, None
    >>> def bwd(_, g):
    ...     return (accy.clip(g, -1.0, 1.0),)
    >>> clip_gradient.defvjp(fwd, bwd)
    >>> x = accy.named(np.array([1.0, 2.0], np.float32), "n")
    >>> accy.grad(lambda x: (clip_gradient(x) * 5.0).sum())(x).array.tolist()
    [1.0, 1.0]
    """
    if fn is None:
        return functools.partial(
            custom_vjp, nondiff_argnums=nondiff_argnums, nondiff_argnames=nondiff_argnames
        )
    return CustomVjp(fn, nondiff_argnums, nondiff_argnames)


class CustomVmap(_CustomFunction):
    """The function behind `accy.custom_vmap(fn)`; give its batching rule with `def_vmap`."""

    kind = "custom_vmap"

    def __init__(self, fn: Callable, sequential: bool = False):
        super().__init__(fn, ())
        self.vmap_rule: Callable | None = None
        self.sequential = sequential  # no rule: vmap calls the function once per example

    def def_vmap(self, rule: Callable) -> Callable:
        """Set the batching rule `rule(axis_size, in_batched, *args) -> (out, out_batched)`,
        as JAX's: `in_batched` holds one tree of bools per argument (which leaves carry the
        mapped axis, first); `out_batched` is a tree prefix of `out` saying which of its
        leaves do. With named axes, the rule sees the mapped axis by its name. Returns `rule`,
        so it works as a decorator."""
        _check_callable(rule, "custom_vmap.def_vmap")
        self.vmap_rule = rule
        self._signatures.clear()
        return rule

    def _require_rules(self) -> None:
        if self.vmap_rule is None and not self.sequential:
            raise TransformError(
                f"accy.custom_vmap function {_name(self.fn)!r} has no batching rule; define "
                "it with @f.def_vmap before calling f"
            )

    def prepare(self, signature: _Signature) -> None:
        """Nothing to trace ahead: the rule is traced when vmap meets the call."""

    def rule_for(self, signature: _Signature, j: int) -> dict[str, Any]:
        if self.sequential:  # a record without a batching rule runs in a scan per example
            return {}
        rules = {"batch": functools.partial(self._batch, signature, j)}
        if not signature.traced.captured:  # (else the function's own derivative)
            rules["jvp"] = functools.partial(self._jvp_call, signature, j)
        return rules

    # Forward mode, as JAX's custom_vmap_jvp: the tangent is a custom call of its own, the
    # function's JVP, whose batching rule is the JVP of the batching rule, so that a tangent
    # under vmap is the rule's derivative.

    def _jvp_call(self, signature: _Signature, j: int, e: Any, primals, tangents, result):
        count = len(signature.arrays)
        record = signature.tangent_records.get(j)
        if record is None:
            record = signature.tangent_records[j] = CustomCall(
                f"{signature.records[j].target}.tangent",
                1,
                result_type=signature.program.output_types[j],
                reference=functools.partial(self._tangent_reference, signature, j),
                fallback=functools.partial(self._tangent_fallback, signature, j),
                kernels={"cpu": _decline, "cuda": _decline},
                batch=functools.partial(self._tangent_batch, signature, j),
            )
        if lookup(record.target, record.version) is not record:
            register(record, replace=True)
        return record.call(e, *primals[:count], *(e.instantiate(t) for t in tangents[:count]))

    def _function_jvp(self, signature: _Signature) -> Any:
        """The function's JVP program: (primals, tangents) -> (outputs, tangents)."""
        found = signature.rule_programs.get("function_jvp")
        if found is None:
            count = len(signature.arrays)
            found = linearize(unroll(signature.program), tuple(range(count))).program
            signature.rule_programs["function_jvp"] = found
        return found

    def _tangent_fallback(self, signature: _Signature, j: int, *values: Any) -> Any:
        outputs = values[0].builder.call(self._function_jvp(signature), list(values))
        return outputs[len(signature.records) + j]

    def _tangent_reference(self, signature: _Signature, j: int, *arrays: Any) -> Any:
        return reference_run(self._function_jvp(signature), list(arrays))[
            len(signature.records) + j
        ]

    def _tangent_batch(self, signature: _Signature, j: int, e: Any, operands, batched, axis):
        count, outputs = len(signature.arrays), len(signature.records)
        primal_b, tangent_b = tuple(batched[:count]), tuple(batched[count:])
        mutual = tuple(p and t for p, t in zip(primal_b, tangent_b, strict=True))
        if any(mutual) and primal_b != tangent_b:
            raise TransformError(
                f"accy lacks the JVP of the custom_vmap function {_name(self.fn)!r} under vmap "
                "with some arguments batched in both primal and tangent and others in only one"
            )
        extent = next(x.ty.extent(axis) for x, b in zip(operands, batched, strict=True) if b)
        what = f"the custom_vmap rule of {_name(self.fn)!r}"
        if any(mutual) or not any(batched):  # the rule on the batch, differentiated
            rule = self._rule_program(signature, axis, extent, mutual)
            constants = _closure_inputs(what, rule, e, signature.closed, [])
            jvp = linearize(unroll(rule.program), tuple(range(count))).program
            pulled = e.call(jvp, [*operands[:count], *constants, *operands[count:]])
            return pulled[outputs + j]
        # Batched primals or tangents only: the rule on one example, differentiated, and that
        # mapped over the examples.
        rule = self._rule_program(signature, axis, extent, (False,) * count, broadcast=False)
        constants = _closure_inputs(what, rule, e, signature.closed, [])
        jvp = linearize(unroll(rule.program), tuple(range(count))).program
        in_axes = [*primal_b, *(False,) * len(constants), *tangent_b]
        mapped = vmap(jvp, axis, in_axes=in_axes, size=extent)
        pulled = e.call(mapped, [*operands[:count], *constants, *operands[count:]])
        return pulled[outputs + j]

    def _batch(self, signature: _Signature, j: int, e: Any, operands, batched, axis) -> Any:
        count = len(signature.arrays)
        if any(batched[count:]):  # a mapped value the function closes over: one call each
            return None
        extent = next(x.ty.extent(axis) for x, b in zip(operands, batched, strict=True) if b)
        traced = self._rule_program(signature, axis, extent, tuple(batched[:count]))
        what = f"the custom_vmap rule of {_name(self.fn)!r}"
        constants = _closure_inputs(what, traced, e, signature.closed, list(operands[count:]))
        outputs = e.call(traced.program, [*operands[:count], *constants])
        return outputs[j] if isinstance(outputs, tuple) else outputs

    def _rule_program(
        self, signature: _Signature, axis: str, extent: int, batched: tuple, broadcast=True
    ):
        """The rule traced on the arguments batched along `axis` as `batched` says, its
        outputs all carrying `axis` first (an unbatched one broadcast; with `broadcast`
        False, none batched and none broadcast: the rule on one example)."""
        name = f"vmap_{_name(self.fn)}" if broadcast else f"vmap_one_{_name(self.fn)}"
        found = signature.rule_programs.get((name, axis, extent, batched))
        if found is not None:
            return found
        rule, fn_name = self.vmap_rule, _name(self.fn)
        rule_name = getattr(rule, "__name__", "rule")
        stand_ins = signature.batched_stand_ins(axis, extent, batched)
        in_batched = signature.batched_flags(batched)
        out_types = signature.program.output_types

        def run_rule(*trees: Any) -> list:
            pair = rule(extent, in_batched, *trees)
            if not isinstance(pair, tuple | list) or len(pair) != 2:
                raise TransformError(
                    f"the custom_vmap rule {rule_name} of {fn_name!r} must return a pair "
                    f"(out, out_batched), got {type(pair).__name__}"
                )
            out, out_batched = pair
            if structure(out) != signature.out_treedef:
                raise TransformError(
                    f"the structure of the output of the custom_vmap rule {rule_name} "
                    f"({structure(out)}) does not match that of the function {fn_name!r} "
                    f"({signature.out_treedef})"
                )
            try:
                flags = optree.broadcast_prefix(out_batched, out, namespace=NAMESPACE)
            except ValueError:
                raise TransformError(
                    f"the structure of the output value and of the output batching "
                    f"specification of the custom_vmap rule {rule_name} do not match: "
                    f"{structure(out)} and {structure(out_batched)}"
                ) from None
            leaves = flatten(out)[0]
            if not broadcast:
                flags = [True] * len(leaves) if any(flags) else flags
                return [
                    _mapped_first(leaf, t, axis, extent, flag, rule_name) if flag else leaf
                    for leaf, t, flag in zip(leaves, out_types, flags, strict=True)
                ]
            return [
                _mapped_first(leaf, t, axis, extent, flag, rule_name)
                for leaf, t, flag in zip(leaves, out_types, flags, strict=True)
            ]

        trees = signature.primal_trees(stand_ins)
        leaves, treedef = flatten((trees, {}))
        found = trace(lambda *t: run_rule(*t), leaves, treedef, name)
        signature.rule_programs[(name, axis, extent, batched)] = found
        return found


def _mapped_first(leaf: Any, expected: Any, axis: str, extent: int, batched: bool, rule: str):
    """An output leaf of a batching rule with the mapped `axis` first (broadcast along it when
    the rule says the leaf is not batched), checked against the function's output type."""
    mapped = expected.with_axes(((axis, extent), *expected.named_extents))
    got = getattr(leaf, "ty", None)
    if not batched and got == expected:
        return leaf.broadcast_to(mapped)
    if batched and got is not None and sorted(got.named_extents) == sorted(mapped.named_extents):
        return leaf if got == mapped else leaf.transpose(mapped.axes)
    raise TransformError(
        f"the custom_vmap rule {rule} returned an output leaf {got} (batched={batched}), but "
        f"the function's output is {expected}: a batched leaf is {mapped}"
    )


def custom_vmap(fn: Callable) -> CustomVmap:
    """`fn` with a batching rule of its own (`jax.custom_batching.custom_vmap`): decorate, then
    give the rule with `@f.def_vmap`. Outside vmap the function runs; under `accy.vmap` the
    rule runs once on the whole batch; a tangent under vmap is the rule's derivative.

    >>> import accy, numpy as np
    >>> @accy.custom_vmap
    ... def f(x):
    ...     return x.sin()
    >>> @f.def_vmap
    ... def rule(axis_size, in_batched, xs):
    ...     return xs.cos(), in_batched[0]
    >>> xs = accy.named(np.zeros(3, np.float32), "n")
    >>> f(xs).array.tolist(), accy.vmap(f, "n")(xs).array.tolist()
    ([0.0, 0.0, 0.0], [1.0, 1.0, 1.0])
    """
    return CustomVmap(fn)


def sequential_vmap(fn: Callable) -> CustomVmap:
    """`fn` that `accy.vmap` calls once per example, in a scan along the mapped axis, instead
    of batching its operations (`jax.custom_batching.sequential_vmap`).

    >>> import accy, numpy as np
    >>> f = accy.sequential_vmap(lambda x: x + 1.0)
    >>> xs = accy.named(np.arange(3.0, dtype=np.float32), "n")
    >>> accy.vmap(f, "n")(xs).array.tolist(), accy.make_program(accy.vmap(f, "n"))(xs).count("scan")
    ([1.0, 2.0, 3.0], 1)
    """
    return CustomVmap(fn, sequential=True)


def closure_convert(fn: Callable, *example_args: Any) -> tuple[Callable, list]:
    """`(converted, consts)`: `fn` with the traced values it closes over hoisted out as extra
    arguments, `converted(*args, *consts)` computing `fn(*args)` (`jax.closure_convert`), so
    that a custom rule given `converted` as a nondiff argument differentiates `consts` as its
    other arguments. `example_args` give the arguments' trees and types; concrete arrays that
    `fn` closes over stay constants.

    >>> import accy, numpy as np
    >>> def solve(c, x):
    ...     converted, consts = accy.closure_convert(lambda x: (x - c) ** 2.0, x)
    ...     return converted(x, *consts)
    >>> c, x = accy.named(np.float32(2.0), ()), accy.named(np.float32(1.0), ())
    >>> accy.grad(solve, argnums=(0, 1))(c, x)[0].item()
    2.0
    """
    _check_callable(fn, "closure_convert")
    leaves, treedef = flatten((tuple(example_args), {}))
    traced = trace(fn, leaves, treedef, _name(fn))
    consts = [c for c in traced.captured if isinstance(c, Value)]
    count = len(example_args)

    def converted(*args: Any) -> Any:
        given, hoisted = args[:count], list(args[count:])
        arg_leaves, arg_def = flatten((tuple(given), {}))
        if arg_def != treedef or len(hoisted) != len(consts):
            raise TransformError(
                f"the inputs to the closure that closure_convert made of {_name(fn)} must be "
                f"the arguments ({treedef}) and then its {len(consts)} consts, got {arg_def} "
                f"and {len(hoisted)}"
            )
        for got, const in zip(hoisted, consts, strict=True):
            if getattr(got, "ty", None) != const.ty:
                raise TransformError(
                    f"closure_convert of {_name(fn)}: a const of type {const.ty} was given "
                    f"{getattr(got, 'ty', got)!r}"
                )
        replaced = iter(hoisted)
        captured = [next(replaced) if isinstance(c, Value) else c for c in traced.captured]
        arrays = [leaf for leaf in arg_leaves if is_array(leaf)]
        builder = innermost([*arrays, *captured])
        if builder is None:  # nothing traced: fn closes over no traced value either
            return fn(*given)
        builder = builder.current()
        outputs = builder.call(traced.program, [builder.lift(v) for v in [*arrays, *captured]])
        outputs = list(outputs) if isinstance(outputs, tuple) else [outputs]
        return unflatten(traced.out_treedef, outputs)

    return converted, consts


def custom_gradient(fn: Callable) -> Callable:
    """`fn(*args) -> (output, vjp)` as a function with that reverse-mode rule
    (`jax.custom_gradient`): `vjp(cotangent)` returns one cotangent per argument (a single one
    for a function of one argument). Built on `custom_vjp`: the residuals are the arguments,
    and the backward pass runs `fn` again to get `vjp`.

    >>> import accy, numpy as np
    >>> @accy.custom_gradient
    ... def f(x):
    ...     return x**2.0, lambda g: (g * x,)
    >>> x = accy.named(np.float32(3.0), ())
    >>> f(x).item(), accy.grad(f)(x).item()
    (9.0, 3.0)
    """
    _check_callable(fn, "custom_gradient")

    @functools.wraps(fn)
    def primal(*args: Any) -> Any:
        return _output_and_vjp(fn, args)[0]

    wrapped = CustomVjp(primal)

    def fwd(*args: Any) -> tuple:
        return _output_and_vjp(fn, args)[0], args

    def bwd(args: tuple, cotangent: Any) -> tuple:
        cotangents = _output_and_vjp(fn, args)[1](cotangent)
        if len(args) == 1 and not isinstance(cotangents, tuple | list):
            cotangents = (cotangents,)  # a single cotangent, as JAX allows
        return tuple(cotangents) if isinstance(cotangents, list) else cotangents

    wrapped.defvjp(fwd, bwd)
    return wrapped


def _output_and_vjp(fn: Callable, args: tuple) -> tuple:
    pair = fn(*args)
    if not isinstance(pair, tuple | list) or len(pair) != 2 or not callable(pair[1]):
        raise TransformError(
            f"the accy.custom_gradient function {_name(fn)!r} must return a pair (output, "
            f"vjp function), got {type(pair).__name__}"
        )
    return pair


__all__ = [
    "SymbolicZero",
    "CustomJvp",
    "CustomVjp",
    "CustomVmap",
    "closure_convert",
    "custom_gradient",
    "custom_jvp",
    "custom_vjp",
    "custom_vmap",
    "sequential_vmap",
    "zero_from_primal",
]
