"""`CustomCall`: a custom call declared once, like JAX's `custom_jvp` / `custom_vjp`.

One record holds everything about a custom call `(target, version)`:

- its result type rule (`result_type`: a `TensorType`, or a function of the operand types),
  and optionally the operand types it accepts (`operand_types`);
- its reference implementation (`reference`: a NumPy function of the operand arrays; the oracle
  that the reference evaluator runs);
- its kernels per backend (`kernels`: artifact format or device name -> an `accy.kernel`
  Program, `KernelCallArtifact` or `KernelCall`, or a function of (operand types, result type)
  returning one); `kernel_registry_for` turns them into the `kernel_call_registry` that the
  CPU and CUDA backends link custom calls against;
- its derivative: a JVP rule `jvp(e, primals, tangents, result) -> tangent` and/or a VJP rule
  `vjp(e, primals, result, cotangent) -> cotangents` (one per operand, None for no
  contribution), written with the emitter `e` (`accy.core.operations.OpsApi`: `e.mul(...)`,
  other records' `record.call(e, ...)`), as the kind table's rules are;
- optionally a `forward` rule `forward(e, primals) -> result`: the primal result that reverse
  mode computes in place of the call (a `custom_vjp`'s `fwd`, whose output may differ from
  the function's, as JAX runs `fwd` under differentiation); without one, the call itself;
- `symbolic_zeros=True`: the JVP rule gets the tangents known to be zero as `Zero(type)`
  (not instantiated); any JVP rule may return one. The forward and VJP rules then also get
  `perturbed=` (one bool per operand: whether reverse mode differentiates it, i.e. its tangent
  is not known to be zero), as JAX's `custom_vjp` fwd sees `CustomVJPPrimal.perturbed`;
- optionally a `fallback` composition (a Python function of traced values computing the same
  function from other operations), differentiated when a rule is missing, to any order;
- optionally a batching rule `batch(e, args, batched, axis) -> result` for `accy.vmap`: the
  operands that `batched` marks carry the mapped `axis` first, and the result must carry it
  first too (written with `e`, as the derivative rules are). Without one, or when it returns
  None, vmap calls the custom call once per example, in a scan along the mapped axis;
- optionally the axes it maps over (`mapped_axes`: names, or a function of the operand types
  returning them): along such an axis, each entry of the result depends only on the operands'
  entries at the same index (operands without the axis are used whole), as a batch axis. The
  SPMD transform (`accy.shard`) keeps such axes split over the devices; every other axis of
  the operands is gathered whole first.

Constructing a `CustomCall` registers it in the one process-wide table
(`accy.core.kinds.control.CUSTOM_CALLS`), where the reference evaluator, `accy.grad`,
`value_and_grad`, `jvp`, `vjp` and `accy.compile` find it by (target, version). Per-call
overrides stay possible: `custom_calls=` (reference), `kernel_call_registry=` (compile) and
user rules (`grad_with`, `grad_with_rules`) are consulted before the record.

Which rule differentiates a call: forward mode (`accy.jvp`, `accy.linearize`) uses the JVP rule,
else the fallback. Reverse mode (`grad`, `value_and_grad`, `vjp`) uses the VJP rule, else the
transpose of the JVP rule (which must then be linear in the tangents, in transposable
operations), else the fallback.

>>> import accy, numpy as np
>>> cube = accy.CustomCall(
...     "doc.cube", version=1,
...     result_type=lambda x: x,
...     reference=lambda x: x ** 3,
...     jvp=lambda e, primals, tangents, result: e.mul(
...         tangents[0], e.mul(e.mul(primals[0], primals[0]), 3.0)),
... )
>>> loss = accy.trace.define("loss", [accy.spec(accy.f32, lane=3)],
...                          lambda b, a: cube(a[0]).sum("lane"))
>>> accy.reference.run(accy.grad(loss), [[1.0, 2.0, 3.0]])[0].tolist()
[3.0, 12.0, 27.0]
>>> cube.unregister()
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from .caches import Table
from .core.builder import Builder
from .core.ir import Attrs, Operation, Program, permute_parameters
from .core.kinds.control import CUSTOM_CALLS, missing_jvp, missing_vjp
from .core.kinds.registry import Linear, Zero, describe
from .core.operations import OpsApi
from .core.types import TensorType
from .core.value import Value
from .core.walk import Inline, run
from .errors import AccyError, CustomCallConflict, CustomCallError, TypeRuleError
from .kernel.artifact import KernelCallArtifact
from .kernel.call import KernelCall, KernelCallRegistry
from .kernel.errors import KernelCallNotFound, KernelError
from .kernel.limits import Limits
from .kernel.logical.program import Program as KernelProgram
from .trace import define
from .transforms.linearize import Linearized, linearize
from .transforms.pullback import pullback
from .transforms.unroll import apply as unroll

ResultType = TensorType | Callable[..., TensorType]
JvpRule = Callable[[OpsApi, list, list, Any], Any]
VjpRule = Callable[[OpsApi, list, Any, Any], Sequence[Any]]
KernelSource = KernelProgram | KernelCallArtifact | KernelCall | Callable[..., Any]

# Device names are accepted where an artifact format is meant.
_FORMATS = {
    "cpu": "cpu_object",
    "cuda": "cuda_ptx",
    "cpu_object": "cpu_object",
    "cuda_ptx": "cuda_ptx",
}


def artifact_format(format: str) -> str:
    """The artifact format for a format or device name ("cpu" -> "cpu_object").

    >>> artifact_format("cuda"), artifact_format("cpu_object")
    ('cuda_ptx', 'cpu_object')
    """
    if format not in _FORMATS:
        raise CustomCallError(
            f"unknown kernel format {format!r}; use one of {', '.join(sorted(_FORMATS))}"
        )
    return _FORMATS[format]


def _check_callable(target: str, name: str, value: Any) -> Any:
    if value is not None and not callable(value):
        raise CustomCallError(
            f"CustomCall {target!r}: {name} must be a function (or None), got {value!r}"
        )
    return value


class CustomCall:
    """A custom call `(target, version)`: type, reference implementation, kernels, derivative.

    See the module docstring for the fields and how they are used. `register=False` makes a
    record without registering it (register it later with `accy.custom.register` or, for a
    while, `accy.custom.registered`); `replace=True` replaces a registered record of the same
    (target, version) instead of raising `CustomCallConflict` when the definitions differ.

    >>> import accy
    >>> double = accy.CustomCall("doc.double", 1, result_type=lambda x: x,
    ...                          reference=lambda x: 2 * x, register=False)
    >>> double
    <CustomCall 'doc.double' v1: reference>
    >>> program = accy.trace.define("twice", [accy.spec(accy.f32, lane=2)],
    ...                             lambda b, a: double(a[0]))
    >>> with accy.custom.registered(double):
    ...     accy.reference.run(program, [[1.0, 2.0]])[0].tolist()
    [2.0, 4.0]
    """

    def __init__(
        self,
        target: str,
        version: int = 1,
        *,
        result_type: ResultType | None = None,
        operand_types: Sequence[TensorType] | None = None,
        reference: Callable[..., Any] | None = None,
        jvp: JvpRule | None = None,
        vjp: VjpRule | None = None,
        fallback: Callable[..., Any] | None = None,
        forward: Callable[..., Any] | None = None,
        kernels: Mapping[str, KernelSource] | None = None,
        mapped_axes: Sequence[str] | Callable[..., Sequence[str]] | None = None,
        batch: Callable[..., Any] | None = None,
        symbolic_zeros: bool = False,
        register: bool = True,
        replace: bool = False,
    ) -> None:
        if not isinstance(target, str) or not target:
            raise CustomCallError(f"CustomCall: target must be a non-empty string, got {target!r}")
        if not isinstance(version, int) or isinstance(version, bool):
            raise CustomCallError(f"CustomCall {target!r}: version must be an int, got {version!r}")
        if result_type is not None and not isinstance(result_type, TensorType):
            _check_callable(target, "result_type (a TensorType or a function)", result_type)
        if operand_types is not None:
            operand_types = tuple(operand_types)
            for position, t in enumerate(operand_types):
                if not isinstance(t, TensorType):
                    raise CustomCallError(
                        f"CustomCall {target!r}: operand_types[{position}] must be a "
                        f"TensorType (accy.spec(...)), got {t!r}"
                    )
        self.target = target
        self.version = version
        self.result_type = result_type
        self.operand_types = operand_types
        self.reference = _check_callable(target, "reference", reference)
        self.jvp = _check_callable(target, "jvp", jvp)
        self.vjp = _check_callable(target, "vjp", vjp)
        self.fallback = _check_callable(target, "fallback", fallback)
        self.forward = _check_callable(target, "forward", forward)
        self.symbolic_zeros = bool(symbolic_zeros)
        self.batch = _check_callable(target, "batch", batch)
        if mapped_axes is not None and not callable(mapped_axes):
            if isinstance(mapped_axes, str) or not all(isinstance(a, str) for a in mapped_axes):
                raise CustomCallError(
                    f"CustomCall {target!r}: mapped_axes must be axis names (a list of str) or "
                    f"a function of the operand types returning them, got {mapped_axes!r}"
                )
            mapped_axes = tuple(mapped_axes)
        self.mapped_axes = mapped_axes
        if kernels is not None and not isinstance(kernels, Mapping):
            raise CustomCallError(
                f"CustomCall {target!r}: kernels must be a mapping of format ('cpu_object', "
                f"'cuda_ptx', or the device 'cpu', 'cuda') to a kernel, got {kernels!r}"
            )
        self.kernels: dict[str, KernelSource] = {
            artifact_format(format): source for format, source in (kernels or {}).items()
        }
        self._fallback_programs: dict[tuple[TensorType, ...], Program] = {}
        self._built: dict[tuple[str, int], tuple[KernelProgram, KernelCall]] = {}
        if register:
            _register(self, replace)

    def __repr__(self) -> str:
        fields = [
            name
            for name in ("reference", "jvp", "vjp", "fallback", "forward", "batch")
            if getattr(self, name) is not None
        ]
        fields += [f"kernel {format}" for format in sorted(self.kernels)]
        return f"<CustomCall {self.target!r} v{self.version}: {', '.join(fields) or 'type only'}>"

    @property
    def where(self) -> str:
        """How messages name this call."""
        return f"custom_call {self.target!r} (version {self.version})"

    def definition(self) -> dict[str, Any]:
        """The fields that define this record; two records with equal definitions are the same.

        >>> sorted(CustomCall("doc.x", register=False).definition())[:4]
        ['batch', 'fallback', 'forward', 'jvp']
        """
        return {
            "result_type": self.result_type,
            "operand_types": self.operand_types,
            "reference": self.reference,
            "jvp": self.jvp,
            "vjp": self.vjp,
            "fallback": self.fallback,
            "forward": self.forward,
            "kernels": self.kernels,
            "mapped_axes": self.mapped_axes,
            "batch": self.batch,
            "symbolic_zeros": self.symbolic_zeros,
        }

    def unregister(self) -> None:
        """Remove this record from the process-wide table (if it is the one registered)."""
        if CUSTOM_CALLS.get((self.target, self.version)) is self:
            del CUSTOM_CALLS[(self.target, self.version)]

    def mapped_axes_for(self, operand_types: Sequence[TensorType]) -> frozenset[str]:
        """The axes this call maps over for operands of `operand_types` (see `mapped_axes`):
        those named that the result has.

        >>> import accy
        >>> rows = CustomCall("doc.rows", result_type=lambda x: x, mapped_axes=["row"],
        ...                   register=False)
        >>> sorted(rows.mapped_axes_for([accy.spec(accy.f32, row=2, col=3)]))
        ['row']
        """
        rule = self.mapped_axes
        if rule is None:
            return frozenset()
        names = rule(*operand_types) if callable(rule) else rule
        result = self.result_type_for(operand_types)
        return frozenset(a for a in names if result.has(a))

    def batched(self, e: OpsApi, op: Operation, operands: list, batched: list, axis: str) -> Any:
        """The call mapped over `axis` by the `batch` rule, checked to have `axis` first and
        the result's other axes; None without a rule (vmap then loops over the examples).

        >>> import accy
        >>> triple = CustomCall("doc.triple", result_type=lambda x: x, reference=lambda x: 3 * x,
        ...                     batch=lambda e, args, batched, axis: triple.call(e, *args))
        >>> p = accy.trace.define("p", [accy.spec(accy.f32, n=2)], lambda b, a: triple(a[0]))
        >>> batched = accy.vmap(p, "example", size=3)  # one call on the whole batch, no loop
        >>> batched.count("scan"), accy.reference.run(batched, [[[1.0, 2.0]] * 3])[0][2].tolist()
        (0, [3.0, 6.0])
        >>> triple.unregister()
        """
        if self.batch is None:
            return None
        result = self.batch(e, operands, batched, axis)
        if result is None:  # the rule declines these operands: vmap loops over the examples
            return None
        extent = next(x.ty.extent(axis) for x, b in zip(operands, batched, strict=True) if b)
        expected = op.type.with_axes(((axis, extent), *op.type.named_extents))
        got = getattr(result, "ty", None)
        if got is not None and sorted(got.named_extents) == sorted(expected.named_extents):
            result = e.transpose(result, expected.axes)  # the axes in another order
        self._check_value("the batch rule returned", result, expected)
        return result

    # -- tracing ----------------------------------------------------------------------------

    def result_type_for(self, operand_types: Sequence[TensorType]) -> TensorType:
        """The result type of a call on operands of `operand_types`, or a `TypeRuleError`.

        >>> import accy
        >>> rule = CustomCall("doc.pair", result_type=lambda a, b: a, register=False)
        >>> rule.result_type_for([accy.spec(accy.f32, lane=2)] * 2)
        <f32[lane=2]>
        >>> rule.result_type_for([accy.spec(accy.f32, lane=2)])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        accy.errors.TypeRuleError: custom_call 'doc.pair' (version 1): its type rule ... got 1 ...
        """
        types = tuple(operand_types)
        if self.operand_types is not None and types != self.operand_types:
            raise TypeRuleError(
                f"{self.where} takes {len(self.operand_types)} operands "
                f"({describe(self.operand_types) or 'none'}), got ({describe(types) or 'none'})"
            )
        rule = self.result_type
        if rule is None:
            raise CustomCallError(
                f"{self.where} has no result type: declare it with result_type= (a TensorType, "
                "or a function of the operand types), or trace the call with "
                "builder.custom_call(target, version, args, result_type)"
            )
        if isinstance(rule, TensorType):
            return rule
        try:
            inspect.signature(rule).bind(*types)
        except TypeError:
            raise TypeRuleError(
                f"{self.where}: its type rule {getattr(rule, '__name__', rule)}"
                f"{inspect.signature(rule)} does not take the operands given; got {len(types)} "
                f"({describe(types) or 'none'})"
            ) from None
        except ValueError:  # a builtin without a signature: just call it
            pass
        result = rule(*types)
        if not isinstance(result, TensorType):
            raise TypeRuleError(
                f"{self.where}: its type rule returned {result!r} for ({describe(types)}); it "
                "must return a TensorType"
            )
        return result

    def call(self, ops: OpsApi, *args: Any) -> Any:
        """Emit the call on `args` through `ops` (a Builder, or the emitter `e` of a rule)."""
        for position, arg in enumerate(args):
            if not isinstance(getattr(arg, "ty", None), TensorType):
                raise CustomCallError(
                    f"{self.where}: operand {position} is {arg!r}, not a traced value; pass "
                    "values of the program being traced (b.full(...) makes a constant one)"
                )
        result_type = self.result_type_for([a.ty for a in args])
        return ops.custom_call(self.target, self.version, list(args), result_type)

    def __call__(self, *args: Value) -> Value:
        """Emit the call on traced values (on their builder); returns the result value."""
        builder = next((a.builder for a in args if isinstance(a, Value)), None)
        if builder is None:
            raise CustomCallError(
                f"{self.where} was called on {', '.join(map(repr, args)) or 'nothing'}; call it "
                "on traced values (inside accy.trace.define), or use record.call(builder, ...)"
            )
        return self.call(builder, *args)

    # -- differentiation (the methods the kind table calls) ----------------------------------

    def tangent(
        self,
        e: OpsApi,
        op: Operation,
        primals: list,
        tangents: list,
        result: Any,
        *,
        reverse: bool = False,
    ) -> Any:
        """The tangent of a call `op` (see the module docstring for which rule is used)."""
        if op.attrs.get("linearized", False):
            raise AccyError(
                f"{self.where}: a linearized call only exists to be transposed by its VJP "
                "rule; it cannot be differentiated again"
            )
        if reverse and self.vjp is not None:
            # A call linear in the tangents that only the VJP rule can transpose; it carries
            # the primals and the result as residuals.
            operands = [*primals, result, *(e.instantiate(t) for t in tangents)]
            attrs = {
                "target": self.target,
                "version": self.version,
                "type": op.type,
                "linearized": True,
            }
            return e.emit("custom_call", operands, attrs)
        if self.jvp is not None:
            # With symbolic_zeros the rule sees which tangents are Zero; any rule may give one.
            given = tangents if self.symbolic_zeros else [e.instantiate(t) for t in tangents]
            tangent = self.jvp(e, primals, list(given), result)
            if isinstance(tangent, Zero) and tangent.type == op.type:
                return tangent
            self._check_value("its JVP rule returned", tangent, op.type)
            return tangent
        if self.fallback is not None:
            return self._fallback_tangent(e, op, primals, tangents, reverse)
        if self.vjp is not None:
            raise missing_jvp(
                op.attrs,
                " (it has a VJP rule, which reverse mode uses; forward mode needs a JVP rule "
                "or a fallback)",
            )
        raise missing_jvp(op.attrs, " and no fallback")

    def primal(self, e: OpsApi, op: Operation, primals: list, perturbed: list[bool]) -> Any:
        """The result that reverse mode computes for `op` (by the `forward` rule), or None
        when the record has no such rule (the call itself is the primal). `perturbed` says
        which operands have tangents not known to be zero."""
        if self.forward is None:
            return None
        if self.symbolic_zeros:
            result = self.forward(e, primals, perturbed=list(perturbed))
        else:
            result = self.forward(e, primals)
        self._check_value("its forward rule returned", result, op.type)
        return result

    def transpose(self, e: OpsApi, op: Operation, cotangent: Any, operands: list) -> list:
        """Cotangents of the linear operands of `op`, by the VJP rule."""
        if op.attrs.get("linearized", False):
            count = (len(operands) - 1) // 2
            primals, result = operands[:count], operands[count]
            linear = operands[count + 1 :]
            perturbed = [isinstance(t, Linear) for t in linear]
            cotangents = self._run_vjp(e, op, primals, result, cotangent, count, perturbed)
            return [None] * (count + 1) + [
                c if isinstance(t, Linear) else None
                for c, t in zip(cotangents, linear, strict=True)
            ]
        # The call itself applied to tangents (a JVP rule made it, so it is linear in them):
        # its VJP rule is its transpose, else its fallback's (JAX transposes a custom_jvp
        # function applied to tangents by its body). Linear operands come as `Linear(type)`.
        if self.vjp is None and self.fallback is not None:
            return self._fallback_transpose(e, op, cotangent, operands)
        if self.vjp is None:
            raise missing_vjp(
                op.attrs,
                " (a JVP rule applies it to tangents, so reverse mode has to transpose it)",
            )
        perturbed = [isinstance(o, Linear) for o in operands]
        cotangents = self._run_vjp(e, op, list(operands), None, cotangent, len(operands), perturbed)
        pairs = zip(cotangents, operands, strict=True)
        return [c if isinstance(o, Linear) else None for c, o in pairs]

    def _fallback_transpose(self, e, op, cotangent, operands: list) -> list:
        """Cotangents of the `Linear` operands by transposing the fallback, which must be
        linear in them (an operation that is not has no transpose rule: an error naming it)."""
        program = self.fallback_program(op.operand_types)
        linear = [i for i, o in enumerate(operands) if isinstance(o, Linear)]
        fixed = [i for i, o in enumerate(operands) if not isinstance(o, Linear)]
        source = permute_parameters(unroll(program), fixed + linear)
        transposed = pullback(Linearized(source, len(fixed), 0, tuple(range(len(linear)))))
        pulled = e.call(transposed.program, [operands[i] for i in fixed] + [cotangent])
        pulled = list(pulled) if isinstance(pulled, tuple) else [pulled]
        cotangents: list[Any] = [None] * len(operands)
        for position, c in zip(linear, pulled, strict=True):
            cotangents[position] = c
        return cotangents

    def _run_vjp(self, e, op, primals, result, cotangent, count, perturbed) -> list:
        if self.symbolic_zeros:
            cotangents = self.vjp(e, primals, result, cotangent, perturbed=perturbed)
        else:
            cotangents = self.vjp(e, primals, result, cotangent)
        if count == 1 and isinstance(getattr(cotangents, "ty", None), TensorType):
            cotangents = [cotangents]
        if not isinstance(cotangents, list | tuple) or len(cotangents) != count:
            raise CustomCallError(
                f"{self.where}: its VJP rule must return a list of {count} cotangents (one per "
                f"operand, None for no contribution), got {cotangents!r}"
            )
        for position, c in enumerate(cotangents):
            if c is not None:
                self._check_value(
                    f"its VJP rule returned for operand {position}", c, op.operand_types[position]
                )
        return list(cotangents)

    def _check_value(self, what: str, value: Any, expected: TensorType) -> None:
        got = getattr(value, "ty", None)
        if got != expected:
            raise CustomCallError(
                f"{self.where}: {what} {got if got is not None else repr(value)}, but it "
                f"must have the type {expected}"
            )

    def fallback_program(self, operand_types: Sequence[TensorType]) -> Program:
        """The fallback traced on operands of `operand_types` (cached per operand types)."""
        key = tuple(operand_types)
        program = self._fallback_programs.get(key)
        if program is None:
            if self.fallback is None:
                raise CustomCallError(f"{self.where} has no fallback")
            fallback = self.fallback
            program = define(f"{self.target}.fallback", list(key), lambda b, args: fallback(*args))
            self._fallback_programs[key] = program
        return program

    def _fallback_tangent(self, e, op, primals, tangents, reverse: bool) -> Any:
        program = self.fallback_program(op.operand_types)
        if tuple(program.output_types) != (op.type,):
            raise CustomCallError(
                f"{self.where}: its fallback returns ({', '.join(map(str, program.output_types))})"
                f" on ({describe(op.operand_types)}), but the call's result type is {op.type}"
            )
        wrt = tuple(i for i, t in enumerate(tangents) if not isinstance(t, Zero))
        linearized = linearize(unroll(program), wrt, reverse=reverse)
        args = list(primals) + [tangents[i] for i in wrt]
        _, tangent = run(linearized.program, Inline(e, args, linearized.program))
        return tangent

    # -- kernels ----------------------------------------------------------------------------

    def kernel(
        self, format: str, operand_types: Sequence[TensorType], result_type: TensorType
    ) -> KernelCall:
        """The kernel that implements a call on `operand_types` in `format` (built on first use).

        Raises `KernelCallNotFound` when the record has no kernel for `format`.

        >>> import accy
        >>> from accy.kernel.examples import custom_double_kernel
        >>> double = CustomCall("doc.double4", register=False,
        ...                     kernels={"cpu": custom_double_kernel()})
        >>> lane = accy.spec(accy.f32, lane=4)
        >>> double.kernel("cpu", [lane], lane).c_signature
        'void accy_kernel_accy_custom_double_4_f32(float* p_dst, const float* p_x)'
        >>> double.kernel("cuda", [lane], lane)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        accy.kernel.errors.KernelCallNotFound: custom_call 'doc.double4' (version 1) has no ...
        """
        fmt = artifact_format(format)
        source = self.kernels.get(fmt)
        if source is None:
            have = ", ".join(sorted(self.kernels)) or "none"
            raise KernelCallNotFound(
                f"{self.where} has no kernel for {fmt!r}; its record has kernels for: {have}. "
                f"Declare one with kernels={{{fmt!r}: ...}} (an accy.kernel Program, artifact or "
                "KernelCall), or pass kernel_call_registry= to accy.compile"
            )
        if callable(source) and not isinstance(source, KernelProgram):
            source = source(tuple(operand_types), result_type)
            if source is None:
                raise KernelCallNotFound(
                    f"{self.where}: its {fmt!r} kernel function declines operands "
                    f"({describe(operand_types)}); accy.compile runs such a call as the "
                    "record's fallback (inline_declined)"
                )
        return self._resolve(fmt, source)

    def declines(
        self, format: str, operand_types: Sequence[TensorType], result_type: TensorType
    ) -> bool:
        """True when the record's kernel function for `format` returns None for these operand
        types (a kernel may serve only some dtypes or sizes) and a fallback can stand in."""
        source = self.kernels.get(artifact_format(format))
        if self.fallback is None or not callable(source) or isinstance(source, KernelProgram):
            return False
        return source(tuple(operand_types), result_type) is None

    def _resolve(self, fmt: str, source: Any) -> KernelCall:
        if isinstance(source, KernelProgram):
            built = self._built.get((fmt, id(source)))
            if built is None or built[0] is not source:
                artifact = source.create_kernel_call_artifact(
                    Limits.default,
                    None,
                    target=self.target,
                    version=self.version,
                    format=fmt,
                )
                built = self._built[(fmt, id(source))] = (source, artifact.call)
            return built[1]
        if isinstance(source, KernelCallArtifact):
            source = source.call
        if not isinstance(source, KernelCall):
            raise CustomCallError(
                f"{self.where}: kernels[{fmt!r}] gave {source!r}; it must be an accy.kernel "
                "Program, a KernelCallArtifact or a KernelCall (or a function returning one)"
            )
        if (source.target, source.version) != (self.target, self.version):
            raise KernelError(
                f"{self.where}: kernels[{fmt!r}] is kernel {source.symbol!r}, built for "
                f"{source.target!r} version {source.version}; build it for this call (or give "
                "the kernel Program itself, which the record builds)"
            )
        if source.format != fmt:
            raise KernelError(
                f"{self.where}: kernels[{fmt!r}] is kernel {source.symbol!r}, built as "
                f"{source.format!r}"
            )
        return source


# -- the process-wide table -------------------------------------------------------------------


def register(record: CustomCall, *, replace: bool = False) -> CustomCall:
    """Register `record` for its (target, version); returns the registered record.

    Registering a record whose definition equals the registered one's is a no-op; a different
    one raises `CustomCallConflict` unless `replace=True`.
    """
    return _register(record, replace)


def _register(record: CustomCall, replace: bool) -> CustomCall:
    if not isinstance(record, CustomCall):
        raise CustomCallError(f"accy.custom.register needs a CustomCall, got {record!r}")
    key = (record.target, record.version)
    existing = CUSTOM_CALLS.get(key)
    if existing is not None and existing is not record and not replace:
        if not isinstance(existing, CustomCall):
            raise CustomCallConflict(f"{record.where} is already registered as {existing!r}")
        theirs, ours = existing.definition(), record.definition()
        differ = [name for name in ours if not _same(theirs[name], ours[name])]
        if not differ:
            return existing
        raise CustomCallConflict(
            f"{record.where} is already registered with a different {', '.join(differ)}; give "
            f"the new definition another version, pass replace=True, or call "
            f"accy.custom.unregister({record.target!r}, {record.version}) first"
        )
    CUSTOM_CALLS[key] = record
    return record


def _same(a: Any, b: Any) -> bool:
    return a is b or a == b


def unregister(target: str, version: int) -> CustomCall | None:
    """Remove the record of (target, version), if any; returns it."""
    return CUSTOM_CALLS.pop((target, version), None)  # type: ignore[return-value]


def lookup(target: str, version: int) -> CustomCall | None:
    """The record registered for (target, version), or None.

    >>> lookup("doc.nothing", 1) is None
    True
    """
    record = CUSTOM_CALLS.get((target, version))
    return record if isinstance(record, CustomCall) else None


def records() -> list[CustomCall]:
    """Every registered record, in registration order."""
    return [r for r in CUSTOM_CALLS.values() if isinstance(r, CustomCall)]


@contextmanager
def registered(*records: CustomCall) -> Iterator[None]:
    """Register `records` (replacing any of the same key) for the duration of a `with` block;
    the previous table entries come back afterwards."""
    saved = {(r.target, r.version): CUSTOM_CALLS.get((r.target, r.version)) for r in records}
    try:
        for record in records:
            register(record, replace=True)
        yield
    finally:
        for key, previous in saved.items():
            if previous is None:
                CUSTOM_CALLS.pop(key, None)
            else:
                CUSTOM_CALLS[key] = previous


def define_reference(
    target: str, version: int, implementation: Callable[..., np.ndarray]
) -> CustomCall:
    """Make `implementation` the reference implementation of (target, version): the record's
    field is set, or a record holding only it is registered."""
    record = lookup(target, version)
    if record is None:
        return CustomCall(target, version, reference=implementation)
    record.reference = _check_callable(target, "reference", implementation)
    return record


# -- kernels for the backends -----------------------------------------------------------------


def inline_declined(program: Program, format: str) -> Program:
    """`program` with each custom call whose record declines it on `format` (see
    `CustomCall.declines`) replaced by the record's fallback composition; `program` itself when
    there is none. Nested programs (scan bodies, cond branches) are expanded the same way.

    >>> import accy
    >>> small = accy.CustomCall("doc.small", result_type=lambda x: x,
    ...     reference=lambda x: 2 * x, fallback=lambda x: x * 2.0,
    ...     kernels={"cpu": lambda types, result: None})  # no kernel for any size
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, lane=2)], lambda b, a: small(a[0]))
    >>> [op.kind for op in inline_declined(p, "cpu").operations]
    ['parameter', 'constant', 'broadcast_in_dim', 'mul']
    >>> small.unregister()
    """
    fmt = artifact_format(format)
    declined = {
        id(op)
        for op in program.operations
        if op.kind == "custom_call"
        and not op.attrs.get("linearized", False)
        and (record := lookup(op.attrs["target"], op.attrs["version"])) is not None
        and record.declines(fmt, op.operand_types, op.type)
    }
    nested = {}  # id(op) -> its attributes with the nested programs expanded
    for op in program.operations:
        attrs = {
            key: inline_declined(value, format) if isinstance(value, Program) else value
            for key, value in op.attrs.items()
        }
        if any(attrs[key] is not value for key, value in op.attrs.items()):
            nested[id(op)] = Attrs(attrs)
    if not declined and not nested:
        return program
    return run(program, _Expand(Builder(program.name), format, declined, nested))


class _Expand:
    """`inline_declined`'s semantics: each operation re-emitted into `builder` (with the
    nested programs of `nested` expanded), each declined custom call as its fallback, itself
    expanded for `format` (a fallback may call records that decline these operands). (A
    class of its own rather than one made per call: a class is a reference cycle, and one
    whose methods held the builder kept every operation it made until a full collection.)"""

    def __init__(self, builder: Builder, format: str, declined: set[int], nested: dict[int, Attrs]):
        self.builder, self.format = builder, format
        self.declined, self.nested = declined, nested

    def bind(self, op: Operation, args: list) -> Any:
        if id(op) not in self.declined:
            attrs = self.nested.get(id(op), op.attrs)
            return self.builder.emit(op.kind, args, attrs, id=op.id)
        record = lookup(op.attrs["target"], op.attrs["version"])
        fallback = inline_declined(record.fallback_program(op.operand_types), self.format)
        (result,) = run(fallback, Inline(self.builder, list(args), fallback))
        return result

    def finish(self, outputs: list) -> Program:
        return self.builder.build(outputs)


def custom_call_sites(program: Program) -> Iterator[Operation]:
    """The custom_call operations of `program`, those in nested programs (scan bodies) too."""
    for op in program.operations:
        if op.kind == "custom_call":
            yield op
        for value in op.attrs.values():
            if isinstance(value, Program):
                yield from custom_call_sites(value)


class RecordKernels:
    """A kernel-call registry: an explicit registry's kernels first, then the records'."""

    def __init__(self, explicit: Any, records: KernelCallRegistry):
        self.explicit = explicit
        self.records = records

    def __repr__(self) -> str:
        return f"RecordKernels({self.explicit!r}, records: {self.records.describe()})"

    def lookup(self, target: str, version: int) -> KernelCall | None:
        """The explicit registry's kernel for (target, version), else a record's, else None."""
        call = self.explicit.lookup(target, version)
        return call if call is not None else self.records.lookup(target, version)

    def require(self, target: str, version: int) -> KernelCall:
        """Like `lookup`, but a missing kernel raises `KernelCallNotFound`."""
        call = self.lookup(target, version)
        return call if call is not None else self.records.require(target, version)


_MERGED = Table("merged kernel registries", "kernels_max_entries")


def kernel_registry_for(program: Program, format: str, explicit_registry: Any = None) -> Any:
    """The kernel-call registry that compiling `program` for `format` needs: the kernels of
    `explicit_registry` (consulted first), and for every other custom call of `program` whose
    record is registered, the record's kernel for `format` (`KernelCallNotFound` when it has
    none). Returns `explicit_registry` itself when no record's kernel is needed, and the same
    registry object for the same kernels, so the backends' caches keep hitting.

    >>> import accy
    >>> from accy.kernel.examples import custom_double_kernel
    >>> double = accy.CustomCall("doc.kernel_double", result_type=lambda x: x,
    ...                          kernels={"cpu": custom_double_kernel()})
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, lane=4)], lambda b, a: double(a[0]))
    >>> kernel_registry_for(p, "cpu").require("doc.kernel_double", 1).format
    'cpu_object'
    >>> kernel_registry_for(p, "cpu") is kernel_registry_for(p, "cpu")
    True
    >>> double.unregister()
    """
    fmt = artifact_format(format)
    found: dict[tuple[str, int], KernelCall] = {}
    for op in custom_call_sites(program):
        key = (op.attrs["target"], op.attrs["version"])
        if explicit_registry is not None and explicit_registry.lookup(*key) is not None:
            continue
        record = lookup(*key)
        if record is None or op.attrs.get("linearized", False):
            continue  # the backend reports a call without a kernel
        call = record.kernel(fmt, op.operand_types, op.type)
        previous = found.setdefault(key, call)
        if previous != call:
            raise KernelError(
                f"{record.where}: program {program.name!r} calls it on operands of different "
                f"types, for which its record gives different kernels ({previous.symbol!r}, "
                f"{call.symbol!r}); a program links one kernel per (target, version), so give "
                "each variant its own version"
            )
    if not found:
        return explicit_registry
    memo_key = (fmt, id(explicit_registry), tuple(sorted(found.items())))
    entry = _MERGED.get(memo_key)
    if entry is not None and entry[0] is explicit_registry:
        return entry[1]
    calls = KernelCallRegistry(found.values())
    if explicit_registry is None:
        merged: Any = calls
    elif isinstance(explicit_registry, KernelCallRegistry):
        merged = KernelCallRegistry([*explicit_registry, *calls])
    else:
        merged = RecordKernels(explicit_registry, calls)
    # The entry holds the explicit registry, so its id cannot be reused while it is here.
    _MERGED.put(memo_key, (explicit_registry, merged))
    return merged


__all__ = [
    "CustomCall",
    "RecordKernels",
    "artifact_format",
    "custom_call_sites",
    "define_reference",
    "inline_declined",
    "kernel_registry_for",
    "lookup",
    "records",
    "register",
    "registered",
    "unregister",
]
