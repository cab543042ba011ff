"""Function transforms over trees of arrays: `jit`, `grad`, `value_and_grad`, `jvp`, `vjp`,
`linearize`.

Each one traces the Python function once per signature (tree structure, dtypes, axis names and
extents, static values), builds a Program from the trace with the Program-level transform of
`accy.gradient`, and caches it; on concrete arrays the program is compiled once per device, on
traced values (inside another transform) it is inlined, so transforms nest freely. Given a
Program instead of a function, `grad`, `value_and_grad`, `jvp`, `vjp` and `linearize` are the
Program transforms of `accy.gradient`, unchanged.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import inspect
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import optree

from .. import gradient
from ..backends.devices import current_default
from ..caches import Group, register
from ..config import config
from ..core import Program, Value
from ..core.types import TensorType
from ..errors import GradientRequiresScalarOutput
from ..trace import define
from ..transforms.simplify import simplify
from .cache_misses import describe_function, explain_static_miss, source_line
from .debugging import call_keeping_ids
from .errors import StaticArgumentError, TransformError
from .lowered import Lowered, abstract_inputs
from .named import NamedArray, check_device
from .tracing import (
    NAMESPACE,
    PYTHON_SCALARS,
    Entry,
    Staged,
    Statics,
    argument_path,
    flatten,
    is_array,
    leaf_paths,
    non_array_leaf,
    structure,
    too_deep,
    trace,
    unflatten,
)

# fn -> {(transform, options): (shared wrapper, weak reference to its handle)}: `accy.grad(loss)`
# called again in a loop finds the same wrapper, and so its compiled programs, as long as `loss`
# lives. Neither the table nor the shared wrapper holds `fn` strongly (a value that held its key
# would keep every function given to a transform, and all it closes over, forever); the handle
# given to the caller does.
_WRAPPERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
register("transformed functions", _WRAPPERS.clear, _WRAPPERS.__len__)  # bound: their lives
# Each jitted function's programs per value of its static arguments.
STATIC_ARGUMENTS = Group("jit static arguments", "jit_signatures_max_entries")


class _Shared:
    """A transform's wrapper that `_memoized` shares among the callers of one function. The
    shared wrapper refers to the function weakly, so that its traced programs last as long as
    the function and keep nothing alive; a caller gets `holding(fn)`, a shallow copy that holds
    the function and shares every table of the wrapper, so that calling it is calling the
    wrapper, with nothing forwarding in between. Programs are built by the shared wrapper
    (`builder`), so that no cached build refers to the function strongly."""

    fn: Callable

    def holding(self, fn: Callable) -> Any:
        """This wrapper as a caller holds it: the same, but holding `fn`."""
        handle = copy.copy(self)
        handle.fn = fn
        handle._shared = self
        if "__wrapped__" in vars(self):
            handle.__wrapped__ = fn
        return handle

    @property
    def builder(self) -> Any:
        """The wrapper whose methods build programs: the shared one."""
        return self.__dict__.get("_shared", self)


class _Handle:
    """A memoized wrapper that is not a `_Shared` (a plain function) as its caller holds it: it
    keeps `fn` alive, and is the shared wrapper (which refers to `fn` weakly) in every other
    respect."""

    def __init__(self, shared: Any, fn: Callable) -> None:
        self._shared = shared
        self.fn = fn
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._shared(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._shared, name)
        if getattr(value, "__self__", None) is not self._shared:
            return value

        # A method of the shared wrapper: it keeps this handle, and so `fn`, alive while it
        # runs, however briefly the caller held the handle.
        def method(*args: Any, handle: _Handle = self, **kwargs: Any) -> Any:
            return value(*args, **kwargs)

        return functools.update_wrapper(method, value)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """On a method: what the shared wrapper binds, else this."""
        bind = getattr(type(self._shared), "__get__", None)
        if instance is None or bind is None:
            return self
        return bind(self._shared, instance, owner)

    def __repr__(self) -> str:
        return type(self._shared).__repr__(self)  # the wrapper's repr, with `fn` itself


def _memoized(fn: Callable, key: tuple, make: Callable[[], Any]) -> Any:
    try:
        per_function = _WRAPPERS.setdefault(fn, {})
    except TypeError:  # not weakly referenceable (or not hashable): no memo
        return make()
    shared, handle = per_function.get(key, (None, lambda: None))
    alive = handle()
    if alive is not None:
        return alive
    if shared is None:
        shared = make()
        shared.fn = weakref.proxy(fn)
        if "__wrapped__" in vars(shared):
            shared.__wrapped__ = shared.fn
    fresh = shared.holding(fn) if isinstance(shared, _Shared) else _Handle(shared, fn)
    per_function[key] = (shared, weakref.ref(fresh))
    return fresh


def _function_name(fn: Any) -> str:
    """`fn`'s `__name__`, through `functools.partial` wrappers (as JAX names a partial)."""
    while isinstance(fn, functools.partial) and not hasattr(fn, "__name__"):
        fn = fn.func
    return getattr(fn, "__name__", "function")


def _name(fn: Callable) -> str:
    name = getattr(fn, "__name__", "function")
    return name if name.isidentifier() else "function"


def _check_callable(fn: Any, transform: str) -> None:
    if isinstance(fn, staticmethod):
        raise TransformError(
            f"accy.{transform} of a staticmethod is not supported: apply @staticmethod outside "
            f"(above) @accy.{transform}, so that the transform gets the function itself"
        )
    if not callable(fn):
        raise TransformError(
            f"accy.{transform} needs a function (or a Program), got {type(fn).__name__} {fn!r}"
        )
    if inspect.isgeneratorfunction(fn):
        raise TransformError(
            f"accy.{transform} needs a function that returns arrays, got the generator function "
            f"{_name(fn)!r} (a function with yield): return its values instead"
        )


# -- jit ---------------------------------------------------------------------------------------


class Jitted(_Shared):
    """A function traced and compiled once per signature; call it like the function."""

    def __init__(
        self,
        fn: Callable,
        device: str | None = None,
        static_argnames: Sequence[str] = (),
        donate_argnums: Sequence[int] = (),
        donate_argnames: Sequence[str] = (),
    ):
        _check_callable(fn, "jit")
        self.fn = fn
        self.device = None if device is None else check_device(device)
        self.donate_argnums = tuple(donate_argnums)
        self.statics = Statics(fn, static_argnames)
        self.donate_argnames = tuple(donate_argnames)
        self._donated_parameters = _donated_parameters(fn, self.donate_argnames, self.statics)
        # The names of the donate_argnums parameters, donated when passed by keyword too.
        self._argnum_names = _names_of_positions(fn, self.donate_argnums, self.statics)
        self._donated_keywords = self.donate_argnames + tuple(self._argnum_names.values())
        self._staged = STATIC_ARGUMENTS.table()
        self._bound: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # methods' objects
        functools.update_wrapper(self, fn, updated=())
        if not hasattr(self, "__name__"):  # a functools.partial: its function's name
            self.__name__ = _function_name(fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.statics.names:  # the common case, kept short: it is per-call overhead
            staged = self._staged.get(())
            if staged is not None:
                return staged.call(args, kwargs)
        staged, args, kwargs = self._staged_for(args, kwargs)
        return staged.call(args, kwargs)

    def _staged_for(self, args: tuple, kwargs: dict) -> tuple[Staged, tuple, dict]:
        args, kwargs, statics = self.statics.split(args, kwargs)
        key = Statics.key(statics)
        try:
            staged = self._staged.get(key)
        except Exception as error:  # a static value's __hash__ or __eq__ raised
            names = ", ".join(repr(name) for name, _, _ in statics)
            raise StaticArgumentError(
                f"accy.jit of {_name(self.fn)!r}: the static arguments ({names}) key the compile "
                f"cache, but hashing or comparing them raised {type(error).__name__}: {error}; "
                "static values must hash and compare with == without raising"
            ) from error
        if staged is None:
            build = functools.partial(self.builder._build, statics)
            staged = self._staged.put(key, self._new_staged(build, key, statics))
        return staged, args, kwargs

    def _new_staged(self, build: Callable, key: tuple, statics: tuple) -> Staged:
        """The Staged of new static values, described for cache-miss explanations (which
        explain it here when other static values were traced before)."""
        staged = Staged(build, self.device)
        name, line = _name(self.fn), source_line(self.fn)
        staged.described = (name, line)
        staged.statics = [(n, k, v) for (n, k, _), (_, v, _) in zip(key, statics, strict=True)]
        if config.explain_cache_misses:
            earlier = [s.statics for s in self._staged.copy().values()]
            if earlier:
                explain_static_miss(describe_function(name, line), staged.statics, earlier)
                staged.first_explained = True
        return staged

    def lower(self, *args: Any, **kwargs: Any) -> Any:
        """The program this function runs for these arguments, and what it compiles to:
        `jax.jit(f).lower(*args)`. See `accy.frontend.inspection.Lowered`.

        >>> import accy, numpy as np
        >>> lowered = accy.jit(lambda x: (x * 2.0).sum()).lower(accy.named(np.ones(3), "n"))
        >>> lowered.program.count("reduce"), "accy_run" in lowered.source()
        (1, True)
        """
        given = optree.tree_leaves(
            (args, kwargs), is_leaf=lambda leaf: isinstance(leaf, TensorType), namespace=NAMESPACE
        )
        abstract = any(isinstance(leaf, TensorType) for leaf in given)
        args, kwargs = abstract_inputs((args, kwargs))
        staged, args, kwargs = self._staged_for(args, kwargs)
        leaves = [leaf for leaf in flatten((args, kwargs))[0] if isinstance(leaf, NamedArray)]
        device = self.device or (leaves[0].device if leaves and not abstract else current_default())
        return Lowered(staged.entry_for((args, kwargs)).program, device)

    def _build(self, statics: tuple, leaves: list[Any], treedef: Any) -> Entry:
        def call(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = Statics.merge(args, kwargs, statics)
            return self.fn(*args, **kwargs)

        traced = trace(call, leaves, treedef, _name(self.fn), prints=True)
        entry = Entry(simplify(traced.program), traced.out_treedef, traced.captured, traced.foreign)
        entry.locations, entry.prints = traced.locations, traced.prints
        keywords = treedef.children()[1].entries()
        argnums = tuple(n for n in self.donate_argnums if self._argnum_names.get(n) not in keywords)
        if self.donate_argnames:  # the named ones passed by position, counted without statics
            passed = treedef.children()[0].num_children
            taken = [position for _, _, position in statics if position is not None]
            for index in self._donated_parameters:
                position = index - sum(p < index for p in taken)
                if index not in taken and position < passed:
                    argnums += (position,)
        entry.donate = donated_inputs(argnums, leaves, treedef, names=self._donated_keywords)
        return entry

    @property
    def traces(self) -> int:
        """How many times the function was traced (once per new signature)."""
        return sum(staged.traces for staged in self._staged.values())

    def __getattr__(self, name: str) -> Any:
        """The function's own attributes (`f.some_value`), as JAX's jitted functions have."""
        fn = self.__dict__.get("fn")
        if fn is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(fn, name)

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        """`accy.jit` on a method: `obj.method` binds `obj` as the first argument. An `obj`
        that is a tree (a dataclass, a named tuple) is traced as an argument, so its arrays are
        inputs; another object is bound as a constant of its own trace (its attributes read
        when that trace is made), one per object, as a static argument would be."""
        if instance is None:
            return self
        if _is_tree_node(instance):
            return functools.partial(self, instance)
        return self._bound_to(instance)

    def _bound_to(self, instance: Any) -> Jitted:
        try:
            bound = self._bound.get(instance)
        except TypeError:  # neither hashable nor weakly referenceable: one trace per lookup
            bound = None
        if bound is None:
            bound = Jitted(
                functools.partial(self.builder.fn, instance),
                self.device,
                tuple(n for n in self.statics.names),
                self.donate_argnums,
            )  # donate_argnames would name the bound function's parameters: not carried
            with contextlib.suppress(TypeError):
                self._bound[instance] = bound
        return bound

    def __repr__(self) -> str:
        try:
            return f"<accy.jit of {self.fn!r}>"
        except Exception:  # the function's own repr failed, or the wrapper lost it
            return "<accy.jit>"


_JIT_CALL = Jitted.__call__


def _call_eagerly(self: Jitted, *args: Any, **kwargs: Any) -> Any:
    """A jitted function's call under `disable_jit`: the Python function itself, run on the
    arguments as given (static ones included)."""
    return self.fn(*args, **kwargs)


@contextlib.contextmanager
def disable_jit(disable: bool = True) -> Iterator[None]:
    """Run every `accy.jit` function's Python eagerly inside a `with` block, as
    `jax.disable_jit()` does: each call runs the function itself, operation by operation, so
    `print` and Python control flow on array values work, and nothing is traced or compiled.
    `disable_jit(False)` turns jit back on inside an enclosing block. The switch is the
    process's (every thread's), and costs a jitted call nothing outside the block: it swaps
    the call of `Jitted` itself rather than being checked per call.

    >>> import accy, numpy as np
    >>> @accy.jit
    ... def relu_sum(x):
    ...     return x.sum() if float(x.sum().item()) > 0 else 0.0 * x.sum()
    >>> x = accy.named(np.array([1.0, 2.0], np.float32), "n")
    >>> with accy.disable_jit():
    ...     relu_sum(x).item()  # a Python branch on a value: eager only
    3.0
    >>> relu_sum.traces
    0
    """
    before = Jitted.__call__
    Jitted.__call__ = _call_eagerly if disable else _JIT_CALL
    try:
        yield
    finally:
        Jitted.__call__ = before


def _is_tree_node(value: Any) -> bool:
    """Whether `value` flattens into leaves (a dataclass, named tuple, registered node) rather
    than being one leaf."""
    leaves, treedef = flatten(value)
    return not treedef.is_leaf()


def _donated_parameters(fn: Callable, names: tuple[str, ...], statics: Statics) -> list[int]:
    """The positions in `fn`'s signature of the parameters `donate_argnames` names (those that
    can be passed by position); a name that is static, positional-only or not a parameter is
    a `TransformError`."""
    if not names:
        return []
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as error:
        raise TransformError(
            f"jit: donate_argnames={names} needs the signature of {_name(fn)!r}, which Python "
            f"cannot give ({error}); pass donate_argnums instead"
        ) from None
    known = {p.name: (i, p.kind) for i, p in enumerate(parameters)}
    has_kwargs = any(p.kind is p.VAR_KEYWORD for p in parameters)
    positions = []
    for name in names:
        if name in statics.names:
            raise TransformError(
                f"jit: {name!r} is in both static_argnames and donate_argnames; a static "
                "argument is a Python value, with no array to donate"
            )
        index, kind = known.get(name, (None, None))
        if kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.VAR_POSITIONAL) or (
            index is None and not has_kwargs
        ):
            raise TransformError(
                f"jit: donate_argnames names {name!r}, which {_name(fn)!r} cannot take by "
                f"keyword; its parameters are {', '.join(known) or 'none'} (donate a "
                "positional-only one with donate_argnums)"
            )
        if kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            positions.append(index)
    return positions


def _names_of_positions(fn: Callable, argnums: tuple[int, ...], statics: Statics) -> dict:
    """The names of the non-static parameters at `argnums` that may be passed by keyword, by
    position."""
    if not argnums:
        return {}
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return {}
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    dynamic = [p for p in parameters if p.kind in positional and p.name not in statics.names]
    return {
        n: dynamic[n].name
        for n in argnums
        if isinstance(n, int)
        and -len(dynamic) <= n < len(dynamic)
        and dynamic[n].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
    }


def donated_inputs(
    argnums: tuple[int, ...],
    leaves: list[Any],
    treedef: Any,
    transform: str = "jit",
    names: tuple[str, ...] = (),
) -> tuple[int, ...]:
    """The program inputs of the array leaves of positional arguments `argnums` (for
    `transform`'s `donate_argnums`).

    >>> import accy, numpy as np
    >>> from accy.frontend.tracing import flatten
    >>> x = accy.named(np.ones(2, np.float32), "n")
    >>> leaves, treedef = flatten((({"a": x, "b": x}, 3.0, x), {}))
    >>> donated_inputs((0,), leaves, treedef), donated_inputs((-1,), leaves, treedef)
    ((0, 1), (2,))
    """
    if not argnums and not names:
        return ()
    ranges = _argument_ranges(treedef)
    input_of = {leaf: p for p, leaf in enumerate(i for i, l in enumerate(leaves) if is_array(l))}
    for n in argnums:
        if not isinstance(n, int) or not -len(ranges) <= n < len(ranges):
            raise TransformError(
                f"{transform}: donate_argnums={argnums} names argument {n!r}, but the call has "
                f"{len(ranges)} positional arguments"
            )
    donated = [i for n in argnums for i in ranges[n]]
    if names:  # keyword arguments named in donate_argnames
        kwargs_def = treedef.children()[1]
        start = treedef.children()[0].num_leaves
        for key, child in zip(kwargs_def.entries(), kwargs_def.children(), strict=True):
            if key in names:
                donated += range(start, start + child.num_leaves)
            start += child.num_leaves
    return tuple(input_of[i] for i in dict.fromkeys(donated) if i in input_of)


def jit(
    fn: Callable | None = None,
    *,
    device: str | None = None,
    static_argnames: Sequence[str] | str = (),
    donate_argnums: Sequence[int] | int = (),
    donate_argnames: Sequence[str] | str = (),
) -> Any:
    """`fn`, traced on its first call for each input signature (tree structure, dtypes, axis
    names and extents, static values), compiled once for the device of its inputs (or
    `device`) and cached. Arguments are trees of `accy.NamedArray`s and scalars; arguments
    named in `static_argnames` are Python values that key the cache (so Python control flow on
    them works); arrays the function closes over are baked in.

    `donate_argnums` (positions among the non-static arguments) lists arguments whose arrays
    the call may overwrite, as JAX's: an output that can take a donated array's memory (a
    parameter's update, an optimizer state) is written into it and returned as that same
    array. The caller must not use a donated argument after the call (its arrays then hold
    the outputs' values). On "cpu" and "cuda" (`accy.DonationError` on "reference"); see
    `accy.compile` for what a donated array must be. `donate_argnames` names them instead,
    whether they are passed by position or by keyword.

    >>> import accy, numpy as np
    >>> @accy.jit
    ... def predict(params, x):
    ...     return (x.contract(params["w"], "input") + params["b"]).tanh()
    >>> params = {"w": accy.named(np.zeros((3, 2), np.float32), ("input", "output")),
    ...           "b": accy.named(np.ones(2, np.float32), ("output",))}
    >>> x = accy.named(np.ones((4, 3), np.float32), ("batch", "input"))
    >>> predict(params, x).shape
    {'batch': 4, 'output': 2}
    >>> y = predict(params, x); predict.traces  # a second call with the same signature: cached
    1
    """
    donate = (donate_argnums,) if isinstance(donate_argnums, int) else tuple(donate_argnums)
    names = (donate_argnames,) if isinstance(donate_argnames, str) else tuple(donate_argnames)
    if fn is None:
        return functools.partial(
            jit,
            device=device,
            static_argnames=static_argnames,
            donate_argnums=donate,
            donate_argnames=names,
        )
    statics = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
    _check_callable(fn, "jit")
    # One Jitted per function and options: `accy.jit(f)` again finds f's traces and programs.
    return _memoized(
        fn,
        ("jit", device, statics, donate, names),
        lambda: Jitted(fn, device, statics, donate, names),
    )


# -- grad and value_and_grad -------------------------------------------------------------------


def _argument_ranges(treedef: Any) -> list[range]:
    """For `(args, kwargs)` flattened with structure `treedef`: the leaf range of each arg."""
    args_def = treedef.children()[0]
    ranges, start = [], 0
    for child in args_def.children():
        ranges.append(range(start, start + child.num_leaves))
        start += child.num_leaves
    return ranges


def _wrt_leaves(
    transform: str,
    argnums: int | tuple[int, ...],
    leaves: list[Any],
    treedef: Any,
    allow_int: bool = False,
) -> list[int]:
    """The leaf indices of the arguments `argnums`; each must hold floating-point arrays
    (or, with `allow_int`, any arrays)."""
    ranges = _argument_ranges(treedef)
    numbers = _argnums_tuple(transform, argnums)
    for number in numbers:
        if not isinstance(number, int) or not -len(ranges) <= number < len(ranges):
            raise TransformError(
                f"accy.{transform}: argnums={argnums!r}, but the function was called with "
                f"{len(ranges)} positional argument{'s' if len(ranges) != 1 else ''}"
            )
    chosen = [i for n in numbers for i in ranges[n]]
    for i in chosen:
        if not is_array(leaves[i]):
            where = argument_path(leaf_paths(unflatten(treedef, leaves))[i])
            raise non_array_leaf(f"accy.{transform}: {where} (in argnums={argnums!r})", leaves[i])
        if not leaves[i].ty.dtype.is_float and not allow_int:
            where = argument_path(leaf_paths(unflatten(treedef, leaves))[i])
            raise TransformError(
                f"accy.{transform}: the gradient with respect to {where} "
                f"({leaves[i].ty}) does not exist: it is not floating-point; convert it, "
                f"move it to an argument outside argnums={argnums!r}, or pass allow_int=True "
                "for a zero gradient"
            )
    return chosen


def _argnums_tuple(transform: str, argnums: Any) -> tuple[int, ...]:
    """`argnums` as a tuple of ints, checked to be an int or a sequence of ints."""
    numbers = (argnums,) if isinstance(argnums, int) else argnums
    if not isinstance(numbers, tuple | list) or not all(
        isinstance(n, int) and not isinstance(n, bool) for n in numbers
    ):
        raise TransformError(
            f"accy.{transform}: argnums={argnums!r}; give the position of an argument (an int) "
            "or a tuple of positions"
        )
    return tuple(numbers)


def _check_scalar_output(transform: str, output: Any, has_aux: bool) -> tuple[Any, Any]:
    """(loss, aux) from what the function returned, checked."""
    loss, aux = _aux_pair(transform, output, "value") if has_aux else (output, None)
    if not isinstance(loss, Value | NamedArray):
        hint = " (with has_aux=True, return (value, aux))" if not has_aux else ""
        raise TransformError(
            f"accy.{transform}: the function must return one scalar array{hint}, got "
            f"{type(loss).__name__}"
        )
    if loss.ty.rank != 0:
        raise GradientRequiresScalarOutput(
            f"accy.{transform}: the function must return a scalar (rank 0), but it returned "
            f"{loss.ty}; reduce it (e.g. .sum() or .mean()), or use accy.jacrev for its Jacobian "
            "or accy.vjp for a vector-Jacobian product"
        )
    if not loss.ty.dtype.is_float:
        raise TransformError(
            f"accy.{transform}: the function returned {loss.ty}; gradients need a "
            "floating-point value"
        )
    return loss, aux


class Differentiated(_Shared):
    """The function behind `accy.grad(fn)` and `accy.value_and_grad(fn)`."""

    def __init__(
        self, fn: Callable, argnums, has_aux: bool, with_value: bool, allow_int: bool = False
    ):
        self.fn = fn
        self.argnums = argnums
        self.has_aux = has_aux
        self.with_value = with_value
        self.allow_int = allow_int
        self.transform = "value_and_grad" if with_value else "grad"
        self.staged = Staged(self._build, static_scalars=True)
        self.numbers = _argnums_tuple(self.transform, argnums)
        functools.update_wrapper(self, fn, updated=())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Python scalars are differentiated where argnums points (as floats), and kept as
        # Python values elsewhere (JAX's grad passes them through untouched too).
        for a in args:  # a loop, not any(...): it is per-call overhead
            if type(a) is not NamedArray:
                args = self._scalars_to_arrays(args)
                break
        return self.staged((args, kwargs))

    def _scalars_to_arrays(self, args: tuple) -> tuple:
        """`args` with the Python floats of the arguments in argnums as f32 scalars (and their
        Python ints refused); arguments without Python scalars are left as they are."""
        count, converted = len(args), list(args)
        to_array = functools.partial(
            _scalar_to_array, transform=self.transform, allow_int=self.allow_int
        )
        try:
            for i, a in enumerate(args):
                if (i in self.numbers or i - count in self.numbers) and _holds_python_scalars(a):
                    converted[i] = optree.tree_map(to_array, a, namespace=NAMESPACE)
        except RecursionError:  # (a try, not depth_checked(): no generator per call)
            raise too_deep() from None
        return tuple(converted)

    def _build(self, leaves: list[Any], treedef: Any) -> Entry:
        chosen = _wrt_leaves(self.transform, self.argnums, leaves, treedef, self.allow_int)
        wrt = [i for i in chosen if leaves[i].ty.dtype.is_float]
        integral = [i for i in chosen if not leaves[i].ty.dtype.is_float]  # zero gradients
        traced = trace(
            self.fn,
            leaves,
            treedef,
            _name(self.fn),
            finish=lambda b, out: _check_scalar_output(self.transform, out, self.has_aux),
            prints=True,
        )
        source = traced.program
        parameter_of = {
            leaf: p for p, leaf in enumerate(i for i, l in enumerate(leaves) if is_array(l))
        }
        wrt_parameters = [parameter_of[i] for i in wrt]
        own = traced.out_treedef.num_leaves  # then the values of its debug_print calls
        loss_only = _outputs_part(source, 0, 1)
        aux_part = _outputs_part(source, 1, own)
        printed_part = _outputs_part(source, own, len(source.outputs))
        combined = (
            gradient.value_and_grad(loss_only, wrt=tuple(wrt_parameters)) if wrt else loss_only
        )
        ranges = _argument_ranges(treedef)
        numbers = self.numbers
        arg_defs = treedef.children()[0].children()
        aux_def = structure(traced.output[1]) if self.has_aux else None
        shape: dict[str, Any] = {}

        def body(b, params):
            loss, *grads = _as_list(call_keeping_ids(b, combined, params))
            aux = None
            if self.has_aux:
                aux = unflatten(aux_def, _as_list(call_keeping_ids(b, aux_part, params)))
            by_leaf = dict(zip(wrt, grads, strict=True))
            by_leaf.update((i, b.full(leaves[i].ty, 0)) for i in integral)
            trees = [unflatten(arg_defs[n], [by_leaf[i] for i in ranges[n]]) for n in numbers]
            grads_tree = trees[0] if isinstance(self.argnums, int) else tuple(trees)
            value = (loss, aux) if self.has_aux else loss
            if self.with_value:
                result = (value, grads_tree)
            else:
                result = (grads_tree, aux) if self.has_aux else grads_tree
            out_leaves, shape["treedef"] = flatten(result)
            if printed_part.outputs:  # printed once, with the primal values (as JAX's)
                out_leaves += _as_list(call_keeping_ids(b, printed_part, params))
            return out_leaves

        program = simplify(define(f"{self.transform}_{source.name}", source.parameter_types, body))
        entry = Entry(program, shape["treedef"], traced.captured, traced.foreign)
        entry.locations = traced.locations  # the forward operations keep their ids
        entry.prints = traced.prints
        return entry

    def __repr__(self) -> str:
        return f"<accy.{self.transform} of {self.fn!r}>"


def _holds_python_scalars(tree: Any) -> bool:
    """Whether `tree` is or holds a Python scalar (its leaves' types, checked in C)."""
    if type(tree) in PYTHON_SCALARS:
        return True
    if type(tree) is NamedArray:
        return False
    kinds = set(map(type, optree.tree_leaves(tree, namespace=NAMESPACE)))
    return not kinds.isdisjoint(PYTHON_SCALARS)


def _scalar_to_array(leaf: Any, transform: str = "grad", allow_int: bool = False) -> Any:
    """A Python float differentiated as an f32 scalar; a Python int or bool is refused, as
    JAX's grad refuses integer inputs (or, with `allow_int`, an i32 or bool scalar)."""
    if type(leaf) is float:
        return np.float32(leaf)
    if allow_int and type(leaf) in (int, bool):
        return np.bool_(leaf) if type(leaf) is bool else np.int32(leaf)
    if type(leaf) in PYTHON_SCALARS:
        raise TransformError(
            f"accy.{transform}: an argument to differentiate is the Python {type(leaf).__name__} "
            f"{leaf!r}; gradients need floating-point inputs: pass {float(leaf)!r} (or "
            "np.float32(...)), move it out of argnums, or pass allow_int=True for a zero "
            "gradient"
        )
    return leaf


def _as_list(outputs: Any) -> list[Any]:
    return list(outputs) if isinstance(outputs, tuple) else [outputs]


def _outputs_part(source: Program, start: int, stop: int) -> Program:
    """`source` returning only its outputs `start:stop` (a function's aux outputs, or the
    values of its debug_print calls, which are not differentiated)."""
    return Program(source.name, source.operations, source.outputs[start:stop], source.value_types)


def grad(
    fn: Callable | Program,
    *args: Any,
    argnums=0,
    has_aux: bool = False,
    allow_int: bool = False,
    **kwargs: Any,
):
    """The gradient of a scalar-valued function with respect to its argument(s) `argnums`.

    `accy.grad(fn)` returns a function with `fn`'s arguments whose result has the tree
    structure of argument `argnums` (a tuple of such trees when `argnums` is a tuple); with
    `has_aux=True`, `fn` returns `(value, aux)` and the result is `(gradient, aux)`. With
    `allow_int=True`, integer and bool leaves of `argnums` are allowed, their gradients zeros of
    their own dtype (JAX's float0 zeros). Given a Program, `accy.grad(program, wrt=...)` is
    `accy.gradient.grad`: the gradient Program.

    >>> import accy, numpy as np
    >>> def loss(params, x):
    ...     return ((x * params["w"]).sum() - params["b"]) ** 2.0
    >>> params = {"w": accy.named(np.array([1.0, 2.0], np.float32), ("lane",)),
    ...           "b": accy.named(np.float32(1.0), ())}
    >>> x = accy.named(np.array([3.0, 4.0], np.float32), ("lane",))
    >>> g = accy.grad(loss)(params, x)  # d/dw = 2 (x.w - b) x = 2 * 10 * x
    >>> g["w"].array.tolist(), g["b"].array.tolist()
    ([60.0, 80.0], -20.0)
    """
    if isinstance(fn, Program):
        return gradient.grad(fn, *args, **kwargs)
    argnums, has_aux = _positional_options("grad", args, kwargs, argnums, has_aux)
    _check_callable(fn, "grad")
    return _memoized(
        fn,
        ("grad", _hashable_argnums("grad", argnums), has_aux, allow_int),
        lambda: Differentiated(fn, argnums, has_aux, with_value=False, allow_int=allow_int),
    )


def value_and_grad(
    fn: Callable | Program,
    *args: Any,
    argnums=0,
    has_aux: bool = False,
    allow_int: bool = False,
    **kwargs: Any,
):
    """Like `grad`, returning `(value, gradient)` (`((value, aux), gradient)` with `has_aux`).
    Given a Program, it is `accy.gradient.value_and_grad`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([1.0, 2.0], np.float32), ("lane",))
    >>> value, g = accy.value_and_grad(lambda x: (x * x).sum())(x)
    >>> value.item(), g.array.tolist()
    (5.0, [2.0, 4.0])
    """
    if isinstance(fn, Program):
        return gradient.value_and_grad(fn, *args, **kwargs)
    argnums, has_aux = _positional_options("value_and_grad", args, kwargs, argnums, has_aux)
    _check_callable(fn, "value_and_grad")
    return _memoized(
        fn,
        ("value_and_grad", _hashable_argnums("value_and_grad", argnums), has_aux, allow_int),
        lambda: Differentiated(fn, argnums, has_aux, with_value=True, allow_int=allow_int),
    )


def _hashable_argnums(transform: str, argnums: Any) -> Any:
    """`argnums` checked, as a cache key: an int stays one (the gradient is then one tree, not
    a tuple of trees)."""
    numbers = _argnums_tuple(transform, argnums)
    return argnums if isinstance(argnums, int) else numbers


def _positional_options(
    transform: str, args: tuple, kwargs: dict, argnums: Any, has_aux: bool
) -> tuple[Any, bool]:
    """(argnums, has_aux), also as JAX's positional spelling `grad(fn, 1)` or `grad(fn, 1,
    True)` takes them."""
    if not args:
        _function_only(transform, args, kwargs)
        return argnums, has_aux
    if len(args) > 2 or argnums != 0 or has_aux or kwargs:
        _function_only(transform, args, kwargs)
    return (*args, has_aux)[:2]


def _function_only(transform: str, args: tuple, kwargs: dict) -> None:
    if args or kwargs:
        given = ", ".join([*map(repr, args), *kwargs])
        raise TransformError(
            f"accy.{transform} of a function takes argnums= and has_aux= only (got {given}); "
            f"wrt= is for Programs"
        )


# -- jvp, vjp, linearize -----------------------------------------------------------------------


def _float_leaves(leaves: Sequence[Any]) -> list[int]:
    return [i for i, leaf in enumerate(leaves) if leaf.ty.dtype.is_float]


def _aux_pair(transform: str, output: Any, first: str = "output") -> tuple[Any, Any]:
    """`(out, aux)` from what a `has_aux=True` function returned, checked to be a pair (`first`
    names its first element in the error)."""
    if not isinstance(output, tuple | list) or len(output) != 2:
        got = f"a {type(output).__name__}" + (
            f" of length {len(output)}" if isinstance(output, tuple | list) else ""
        )
        raise TransformError(
            f"accy.{transform}(..., has_aux=True): the function must return a pair "
            f"({first}, aux), got {got}"
        )
    return tuple(output)


def _trace_on(
    fn: Callable,
    leaves: list[Any],
    primal_def: Any,
    transform: str = "",
    has_aux: bool = False,
    prints: bool | str = False,
):
    """Trace `fn(*primals)`, the primals being the tuple of trees `primal_def` describes. With
    `has_aux`, the traced outputs are the leaves of `(out, aux)`: out's first; the values of
    its debug_print calls follow (`prints`, as `trace`'s)."""
    finish = (lambda b, out: _aux_pair(transform, out)) if has_aux else None
    return trace(
        fn,
        leaves,
        structure((unflatten(primal_def, leaves), {})),
        _name(fn),
        finish=finish,
        prints=prints,
    )


def _outputs_and_aux(traced: Any, has_aux: bool) -> tuple[Any, Any, int]:
    """(structure of the differentiated outputs, structure of aux or None, how many program
    outputs are differentiated) of a function traced by `_trace_on`."""
    if not has_aux:
        return traced.out_treedef, None, traced.out_treedef.num_leaves
    out_def, aux_def = traced.out_treedef.children()
    return out_def, aux_def, out_def.num_leaves


def _without_aux(source: Program, count: int) -> Program:
    """`source` returning only its first `count` outputs (the aux outputs are not
    differentiated)."""
    return Program(source.name, source.operations, source.outputs[:count], source.value_types)


def _split_primals_and_other(treedef: Any, leaves: list[Any]):
    """For a staged call on `(primals, other)`: (primal leaves, their structure, other
    leaves, their structure)."""
    primal_def, other_def = treedef.children()
    count = primal_def.num_leaves
    return leaves[:count], primal_def, leaves[count:], other_def


def _check_like(
    transform: str, what: str, given: list[Any], given_def: Any, types: list[Any], like_def: Any
) -> None:
    """`given` must have the structure `like_def`, and each floating-point leaf its type."""
    like = "primals" if what == "tangents" else "function's outputs"
    if given_def != like_def:
        raise TransformError(
            f"accy.{transform}: the {what} must have the structure of the {like}: expected "
            f"{like_def}, got {given_def}"
        )
    for i, (leaf, expected) in enumerate(zip(given, types, strict=True)):
        if expected.dtype.is_float and leaf.ty != expected:
            raise TransformError(
                f"accy.{transform}: {what} leaf {i} has type {leaf.ty}, but the {like} have "
                f"{expected} there"
            )


class _Jvp(_Shared):
    """(primals, tangents) -> (outputs, output tangents[, aux]), traced per signature; the
    function's debug_print calls print their primal values (`prints`, as `trace`'s: "drop"
    for linearize's, whose forward pass printed them)."""

    def __init__(self, fn: Callable, has_aux: bool = False, prints: bool | str = True):
        self.fn = fn
        self.has_aux = has_aux
        self.prints = prints
        self.staged = Staged(self._build)

    def __call__(self, primals: tuple, tangents: tuple) -> Any:
        return self.staged((tuple(primals), tuple(tangents)))

    def _build(self, leaves: list[Any], treedef: Any) -> Entry:
        primal_leaves, primal_def, tangent_leaves, tangent_def = _split_primals_and_other(
            treedef, leaves
        )
        primal_types = [leaf.ty for leaf in primal_leaves]
        _check_like("jvp", "tangents", tangent_leaves, tangent_def, primal_types, primal_def)
        traced = _trace_on(self.fn, primal_leaves, primal_def, "jvp", self.has_aux, self.prints)
        out_def, aux_def, outputs = _outputs_and_aux(traced, self.has_aux)
        source = traced.program
        wrt = _float_leaves(primal_leaves)
        forward = gradient.jvp(_without_aux(source, outputs), wrt=tuple(wrt))
        # the aux outputs, then the values of the function's debug_print calls
        aux_part = _outputs_part(source, outputs, len(source.outputs))
        count = len(primal_leaves)
        specs = [leaf.ty for leaf in leaves] + list(source.parameter_types[count:])

        def body(b, params):
            primals, tangents, captured = (
                params[:count],
                params[count : 2 * count],
                params[2 * count :],
            )
            results = _as_list(b.call(forward, [*primals, *captured, *(tangents[i] for i in wrt)]))
            if aux_part.outputs:
                results += _as_list(b.call(aux_part, [*primals, *captured]))
            return results

        program = simplify(define(f"jvp_{source.name}", specs, body))
        numbered = unflatten(out_def, list(range(outputs)))
        pair = (numbered, numbered)
        if aux_def is not None:
            pair += (unflatten(aux_def, list(range(aux_def.num_leaves))),)
        entry = Entry(program, structure(pair), traced.captured, traced.foreign)
        entry.prints = traced.prints
        return entry


class _Vjp(_Shared):
    """(primals, output cotangents) -> one cotangent tree per primal, traced per signature."""

    def __init__(self, fn: Callable, has_aux: bool = False):
        self.fn = fn
        self.has_aux = has_aux
        self.staged = Staged(self._build)

    def _build(self, leaves: list[Any], treedef: Any) -> Entry:
        primal_leaves, primal_def, ct_leaves, ct_def = _split_primals_and_other(treedef, leaves)
        # its forward pass (`accy.vjp`'s call of the function) printed the debug_print values
        traced = _trace_on(self.fn, primal_leaves, primal_def, "vjp", self.has_aux, "drop")
        out_def, _, outputs = _outputs_and_aux(traced, self.has_aux)
        source = _without_aux(traced.program, outputs)
        out_types = list(source.output_types)
        _check_like("vjp", "cotangents", ct_leaves, ct_def, out_types, out_def)
        wrt = _float_leaves(primal_leaves)
        backward = gradient.vjp(source, wrt=tuple(wrt))
        count = len(primal_leaves)
        specs = [leaf.ty for leaf in leaves] + list(source.parameter_types[count:])

        def body(b, params):
            primals = params[:count]
            cts = params[count : count + len(ct_leaves)]
            captured = params[count + len(ct_leaves) :]
            results = _as_list(b.call(backward, [*primals, *captured, *cts]))[outputs:]
            by_leaf = dict(zip(wrt, results, strict=True))
            return [by_leaf[i] if i in by_leaf else b.zeros(primals[i].ty) for i in range(count)]

        program = simplify(define(f"vjp_{source.name}", specs, body))
        return Entry(program, primal_def, traced.captured, traced.foreign)


def _forward(fn: Callable, primals: tuple, transform: str, has_aux: bool) -> tuple[Any, Any]:
    """`fn(*primals)` run through its cached `jit`: (output, aux) with `has_aux`, else
    (output, None)."""
    output = jit(fn)(*primals)
    return _aux_pair(transform, output) if has_aux else (output, None)


def jvp(
    fn: Callable | Program,
    primals: Any = None,
    tangents: Any = None,
    *,
    has_aux: bool = False,
    **kwargs: Any,
):
    """Forward mode: `(fn(*primals), the derivative of fn at primals along tangents)`.

    `primals` and `tangents` are tuples of argument trees of one structure; the tangent of an
    integer leaf is ignored. With `has_aux=True`, `fn` returns `(output, aux)` and the result
    is `(output, output tangent, aux)`, as JAX's. Given a Program, `accy.jvp(program, wrt)` is
    `accy.gradient.jvp`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([1.0, 2.0], np.float32), ("lane",))
    >>> t = accy.named(np.array([1.0, 0.0], np.float32), ("lane",))
    >>> y, dy = accy.jvp(lambda x: x * x, (x,), (t,))
    >>> y.array.tolist(), dy.array.tolist()
    ([1.0, 4.0], [2.0, 0.0])
    >>> y, dy, aux = accy.jvp(lambda x: (x * x, x.sum()), (x,), (t,), has_aux=True)
    >>> aux.item()
    3.0
    """
    if isinstance(fn, Program):
        return gradient.jvp(fn, *(() if primals is None else (primals,)), **kwargs)
    _check_callable(fn, "jvp")
    if kwargs:
        raise TransformError(f"accy.jvp of a function takes has_aux= only, got {', '.join(kwargs)}")
    if not isinstance(primals, tuple | list) or not isinstance(tangents, tuple | list):
        raise TransformError(
            "accy.jvp(fn, primals, tangents): primals and tangents are tuples of arguments, "
            f"got {type(primals).__name__} and {type(tangents).__name__}"
        )
    return _memoized(fn, ("jvp", has_aux), lambda: _Jvp(fn, has_aux))(primals, tangents)


def vjp(fn: Callable | Program, *primals: Any, has_aux: bool = False, **kwargs: Any):
    """Reverse mode: `(fn(*primals), vjp_fn)`, where `vjp_fn(cotangent)` (one tree shaped like
    fn's output) returns a tuple with one cotangent tree per primal (zeros for integer
    leaves). With `has_aux=True`, `fn` returns `(output, aux)` and the result is
    `(output, vjp_fn, aux)`, as JAX's. Given a Program, `accy.vjp(program, wrt)` is
    `accy.gradient.vjp`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([1.0, 2.0], np.float32), ("lane",))
    >>> y, back = accy.vjp(lambda x: x * x, x)
    >>> (ct,) = back(accy.named(np.ones(2, np.float32), ("lane",)))
    >>> ct.array.tolist()
    [2.0, 4.0]
    >>> y, back, aux = accy.vjp(lambda x: (x * x, {"n": x.sum()}), x, has_aux=True)
    >>> aux["n"].item()
    3.0
    """
    if isinstance(fn, Program):
        return gradient.vjp(fn, *primals, **kwargs)
    _check_callable(fn, "vjp")
    if kwargs:
        raise TransformError(f"accy.vjp of a function takes has_aux= only, got {', '.join(kwargs)}")
    output, aux = _forward(fn, primals, "vjp", has_aux)
    vjp_fn = VjpFunction(tuple(primals), fn, has_aux)
    return (output, vjp_fn, aux) if has_aux else (output, vjp_fn)


# The functions vjp and linearize return are trees whose leaves are the primals (and whose
# function is static): like JAX's (tree_util.Partial), they can be returned from and passed
# to jitted functions. Their backward and forward passes recompute from the primals.


@dataclasses.dataclass(eq=False)
class VjpFunction:
    """What `accy.vjp` returns: `f_vjp(cotangent)` is one cotangent tree per primal."""

    primals: tuple
    fn: Callable = dataclasses.field(metadata={"static": True})
    has_aux: bool = dataclasses.field(default=False, metadata={"static": True})

    def __call__(self, *cotangents: Any) -> tuple:
        if len(cotangents) != 1:
            raise TransformError(
                f"accy.vjp: the function returned for {_name(self.fn)!r} takes one cotangent "
                f"tree (the output's structure), but was called with {len(cotangents)} "
                "arguments; pass a tuple for a function that returns several outputs"
            )
        backward = _memoized(self.fn, ("vjp", self.has_aux), lambda: _Vjp(self.fn, self.has_aux))
        return tuple(backward.staged((self.primals, cotangents[0])))


@dataclasses.dataclass(eq=False)
class JvpFunction:
    """What `accy.linearize` returns: `f_jvp(*tangents)` is the output's tangent."""

    primals: tuple
    fn: Callable = dataclasses.field(metadata={"static": True})
    has_aux: bool = dataclasses.field(default=False, metadata={"static": True})

    def __call__(self, *tangents: Any) -> Any:
        # The forward pass printed the function's debug_print values: the tangents' calls drop them.
        forward = _memoized(
            self.fn, ("linearize", self.has_aux), lambda: _Jvp(self.fn, self.has_aux, "drop")
        )
        return forward(self.primals, tangents)[1]


def fwd_and_bwd(
    fn: Callable, argnums: int | Sequence[int], has_aux: bool = False
) -> tuple[Callable, Callable]:
    """`jax.fwd_and_bwd`: `fwd(*args)` is `(fn(*args), residuals)` (`(output, residuals, aux)`
    with `has_aux`), and `bwd(residuals, cotangent)` the tuple of cotangents of the arguments
    `argnums`; both are jitted, so a training loop traces each once. The residuals are the
    arguments themselves: accy's backward pass recomputes what it needs from the primals (as
    the function `accy.vjp` returns does), so they cross jit boundaries as arrays.

    >>> import accy, numpy as np
    >>> x = accy.named(np.ones((2, 2), np.float32), ("i", "k"))
    >>> w = accy.named(np.ones((2, 3), np.float32), ("k", "j"))
    >>> fwd, bwd = accy.fwd_and_bwd(lambda x, w: x.contract(w, "k"), argnums=(0, 1))
    >>> y, residuals = fwd(x, w)
    >>> ct_x, ct_w = bwd(residuals, y)
    >>> ct_w.shape, ct_w.array.tolist()[0]
    ({'k': 2, 'j': 3}, [4.0, 4.0, 4.0])
    """
    _check_callable(fn, "fwd_and_bwd")
    numbers = _argnums_tuple("fwd_and_bwd", argnums)

    def forward(*args: Any) -> tuple:
        if has_aux:
            output, aux = _aux_pair("fwd_and_bwd", fn(*args))
            return output, args, aux
        return fn(*args), args

    def backward(residuals: tuple, cotangent: Any) -> tuple:
        for number in numbers:
            if not -len(residuals) <= number < len(residuals):
                raise TransformError(
                    f"accy.fwd_and_bwd: argnums={argnums!r}, but the function was called with "
                    f"{len(residuals)} positional argument{'s' if len(residuals) != 1 else ''}"
                )
        pullback = vjp(fn, *residuals, has_aux=has_aux)[1]
        cotangents = pullback(cotangent)
        return tuple(cotangents[number] for number in numbers)

    forward.__name__ = f"fwd_{_name(fn)}"
    backward.__name__ = f"bwd_{_name(fn)}"
    return jit(forward), jit(backward)


def linearize(fn: Callable | Program, *primals: Any, has_aux: bool = False, **kwargs: Any):
    """`(fn(*primals), f_jvp)`, where `f_jvp(*tangents)` is the derivative of fn at primals
    along the tangents; with `has_aux=True`, `(output, f_jvp, aux)`. Given a Program,
    `accy.linearize(program, wrt)` is `accy.gradient.linearize`.

    >>> import accy, numpy as np
    >>> x = accy.named(np.array([1.0, 2.0], np.float32), ("lane",))
    >>> y, f_jvp = accy.linearize(lambda x: x * x, x)
    >>> f_jvp(accy.named(np.array([0.0, 1.0], np.float32), ("lane",))).array.tolist()
    [0.0, 4.0]
    """
    if isinstance(fn, Program):
        return gradient.linearize(fn, *primals, **kwargs)
    _check_callable(fn, "linearize")
    if kwargs:
        raise TransformError(
            f"accy.linearize of a function takes has_aux= only, got {', '.join(kwargs)}"
        )
    output, aux = _forward(fn, primals, "linearize", has_aux)
    f_jvp = JvpFunction(tuple(primals), fn, has_aux)

    return (output, f_jvp, aux) if has_aux else (output, f_jvp)


__all__ = [
    "Jitted",
    "fwd_and_bwd",
    "grad",
    "jit",
    "jvp",
    "linearize",
    "value_and_grad",
    "vjp",
]
