"""`Args` and `Param`: a kernel's parameters as its body sees them, loaded and stored."""

from __future__ import annotations

from collections.abc import Mapping

from ..ir import RESULT, Buffer, Index, Index2D, Load, Store
from .scope import Scope, Trace
from .values import Number, Value


class Param:
    """A kernel parameter inside the body: loaded from, or (`dst` only) stored to."""

    def __init__(self, trace: Trace, name: str, buffer: Buffer):
        self.name = name
        self.dtype = buffer.dtype
        self._trace = trace

    def __repr__(self) -> str:
        return f"<kernel param {self.name}: {self.dtype.name}>"

    def load(self, inner: Scope, index: Index) -> Value:
        """The element at `index`, as a value of the parameter's dtype.

        >>> from accy.kernel.examples import custom_double_kernel
        >>> "const float v1 = p_x[i0];" in custom_double_kernel().c_source()
        True
        """
        what = f"load of {self.name!r}"
        self._enter(inner, what)
        if self.name == RESULT:
            self._trace.fail(
                f"{what}: {RESULT!r} is the call's result and write-only (each element has one "
                f"writer and no reader, so no thread can see another's unfinished write)"
            )
        inner._require_index(index, what)
        self._trace.reads[self.name] = max(self._trace.reads.get(self.name, 0), index.size)
        return inner._emit(self.dtype, lambda var: Load(var, self.dtype, self.name, index))

    def store(self, inner: Scope, value: Value | Number, index: Index) -> None:
        """Write `value` to the element at `index`: the loop's own index (or, in a 2-D loop, its
        transpose), once per kernel, so that each element has exactly one writer.

        >>> from accy.kernel.examples import custom_double_kernel
        >>> "p_dst[i0] = v2;" in custom_double_kernel().c_source()
        True
        """
        what = f"store to {self.name!r}"
        self._enter(inner, what)
        self._check_store_target(what, inner)
        inner._require_index(index, what)
        self._check_store_index(what, inner, index)
        if not isinstance(value, Value):
            value = inner.constant(value, self.dtype)
        value = inner._visible(value, what)
        if value.dtype != self.dtype:
            self._trace.fail(
                f"{what}: the value is {value.dtype.name} but {self.name!r} holds "
                f"{self.dtype.name}; convert it with value.cast(inner, accy.{self.dtype.name})"
            )
        self._trace.writes[self.name] = index.size
        inner.statements.append(Store(self.name, self.dtype, index, value.var))

    def _enter(self, inner: Scope, what: str) -> None:
        # A parameter records its kernel's reads and writes: using it in another kernel's scope
        # would leave that kernel's accesses unchecked.
        if not isinstance(inner, Scope) or inner._trace is not self._trace:
            self._trace.fail(f"{what} needs a scope of this kernel, got {inner!r}")
        inner._require_active(what)

    def _check_store_target(self, what: str, inner: Scope) -> None:
        if self.name != RESULT:
            self._trace.fail(
                f"{what}: only {RESULT!r} (the call's result) may be written; {self.name!r} is "
                f"an operand of the call"
            )
        if self.name in self._trace.writes:
            self._trace.fail(
                f"{what}: {RESULT!r} is already stored once; each element has one writer"
            )
        if inner.kind != "for_each":
            self._trace.fail(
                f"{what} belongs in a for_each loop's body, not in {inner.kind} {inner.label!r}"
            )

    def _check_store_index(self, what: str, inner: Scope, index: Index) -> None:
        # A store at the loop's own index (or its transpose) writes each element exactly once.
        loop = inner.loop_index
        allowed = [loop] + ([loop.transposed()] if isinstance(loop, Index2D) else [])
        if index not in allowed:
            self._trace.fail(
                f"{what}: stores use the loop's own index (or, for for_each_2d, "
                f"index.transposed()), so that every element is written by exactly one thread"
            )


class Args:
    """The kernel's parameters, by name: `args.param("x")`."""

    def __init__(self, trace: Trace, parameters: Mapping[str, Buffer]):
        self._trace = trace
        self._params = {name: Param(trace, name, b) for name, b in parameters.items()}

    def param(self, name: str) -> Param:
        """The parameter called `name`; an unknown name is a KernelError listing the others.

        >>> import accy
        >>> from accy.kernel import dynamic_buffer, logical
        >>> logical.Program(name="k", parameters={"dst": dynamic_buffer(accy.f32)},
        ...     body=lambda k, args: args.param("y"))
        Traceback (most recent call last):
        ...
        accy.kernel.errors.KernelError: kernel 'k': has no parameter 'y'; its parameters are dst
        """
        if name not in self._params:
            self._trace.fail(
                f"has no parameter {name!r}; its parameters are {', '.join(self._params)}"
            )
        return self._params[name]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._params)
