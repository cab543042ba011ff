"""`KernelCall`, a built kernel bound to a custom-call target, and the registry that finds it.

This is the contract with the backends. A lowering that meets `custom_call(...) {target,
version}` asks `registry.require(target, version)` for the `KernelCall`, checks the call with
`check_call(operand_types, result_type)`, and then:

- CPU: includes `c_source` once in its translation unit and calls `symbol(dst, operands...)`
  with one pointer per parameter, in declaration order (`parameters`); `dst` points to the
  call's result, the others to the call's operands, in order.
- CUDA: loads `ptx`, and launches `kernel_name` with `grid` blocks of `block` threads and the
  same pointer arguments; or, when the call has a `library` (a `LibraryStep`: a host library
  such as cuDNN issuing its own work on the stream), loads it once and lets it issue its work,
  with the same pointers, inside the program's CUDA graph.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..core.types import DType, TensorType
from .errors import KernelCallMismatch, KernelCallNotFound, KernelError
from .ir import RESULT

if TYPE_CHECKING:
    import numpy as np


class LibraryStep(Protocol):
    """A custom call's CUDA implementation that is a host library call (cuDNN, ...), not a PTX
    kernel. It is an immutable description (compared and hashed as part of its `KernelCall`):

    - `scratch_bytes`: device memory it needs besides its operands and result (its own
      intermediates and the library's workspace), given to it at a fixed address;
    - `load(ordinal)`: called once when a program using it is loaded on GPU `ordinal` (outside
      any stream capture: build plans, compile helper kernels, warm up); returns the issuer,
      an object with `bind(stream)` (the stream the following work goes to, called before a
      capture begins) and `issue(dst, operands, scratch)` (device addresses as ints: the
      result, the operands in order, the scratch), which only enqueues work on that stream, so
      that it can be captured into a CUDA graph.
    """

    scratch_bytes: int

    def load(self, ordinal: int) -> Any: ...


@dataclass(frozen=True)
class KernelCall:
    """A kernel built as the implementation of custom call `(target, version)`."""

    target: str
    version: int
    symbol: str  # the C function's name
    kernel_name: str  # the CUDA entry point's name in `ptx`
    parameters: tuple[tuple[str, DType], ...]  # in declaration order: one pointer each
    written: tuple[str, ...]  # parameters passed as `T*`; the others are `const T*`
    extents: tuple[tuple[str, int], ...]  # elements the kernel touches in each parameter
    c_source: str
    cuda_source: str
    format: str  # "cpu_object" or "cuda_ptx"
    c_signature: str  # `void symbol(float* p_dst, const float* p_x)`, for a prototype
    ptx: str | None = None
    block: tuple[int, int, int] | None = None
    grid: tuple[int, int, int] | None = None
    library: LibraryStep | None = None  # CUDA: a host library's step instead of `ptx`

    @classmethod
    def of_library(
        cls,
        target: str,
        symbol: str,
        parameters: Sequence[tuple[str, TensorType]],
        description: str,
        library: LibraryStep,
        version: int = 1,
    ) -> KernelCall:
        """The CUDA `KernelCall` of a host library's step (`library`: cuDNN, NCCL...), which has
        no kernel of its own: `parameters` are `dst` (written) and the operands, in order, with
        their types; `description` is how listings and errors show it.

        >>> import accy
        >>> t = accy.TensorType(accy.f32, (("n", 4),))
        >>> call = KernelCall.of_library("copy", "lib_copy", [("dst", t), ("x", t)], "a copy", None)
        >>> call.written, call.extents, call.format
        (('dst',), (('dst', 4), ('x', 4)), 'cuda_ptx')
        """
        return cls(
            target=target,
            version=version,
            symbol=symbol,
            kernel_name=symbol,
            parameters=tuple((name, t.dtype) for name, t in parameters),
            written=(RESULT,),
            extents=tuple((name, t.size) for name, t in parameters),
            c_source="",
            cuda_source="",
            format="cuda_ptx",
            c_signature=description,
            library=library,
        )

    def __repr__(self) -> str:
        return f"<KernelCall {self.target!r} v{self.version}: {self.c_signature}>"

    @property
    def where(self) -> str:
        """How errors name this call: its target, version and kernel."""
        return f"custom_call {self.target!r} (version {self.version}, kernel {self.symbol!r})"

    @property
    def operand_parameters(self) -> tuple[tuple[str, DType], ...]:
        """The parameters bound to the call's operands, in order (all but `dst`).

        >>> from accy.kernel.examples import custom_double_kernel, map_kernel
        >>> import accy
        >>> kernel = map_kernel("fma", accy.f32, [accy.f32] * 3,
        ...     lambda inner, a, b, c: a.mul(inner, b).add(inner, c), 4)
        >>> call = kernel.create_kernel_call_artifact(
        ...     accy.kernel.Limits.testing, None, target="fma", version=1).call
        >>> [name for name, _ in call.operand_parameters]
        ['x0', 'x1', 'x2']
        """
        return tuple((name, dtype) for name, dtype in self.parameters if name != RESULT)

    @property
    def result_dtype(self) -> DType:
        """The dtype of `dst`, which the call's result must have."""
        return dict(self.parameters)[RESULT]

    def extent_of(self, parameter: str) -> int:
        """Elements the kernel reads from (or writes to) `parameter`; 0 if it never touches it.

        >>> import accy
        >>> from accy.kernel.examples import custom_double_kernel
        >>> call = custom_double_kernel().create_kernel_call_artifact(
        ...     accy.kernel.Limits.testing, None, target="double", version=1).call
        >>> call.extent_of("x"), call.extent_of("dst")
        (4, 4)
        """
        return dict(self.extents).get(parameter, 0)

    def check_call(self, operand_types: Sequence[TensorType], result_type: TensorType) -> None:
        """Raise `KernelCallMismatch` (naming the target) unless the call fits the kernel.

        Operands bind to the parameters other than `dst`, in declaration order, and the result
        to `dst`: each must have the parameter's dtype and at least the elements the kernel
        touches; the result must have exactly the elements the kernel writes.

        >>> import accy
        >>> from accy.kernel.examples import custom_double_kernel
        >>> call = custom_double_kernel().create_kernel_call_artifact(
        ...     accy.kernel.Limits.testing, None, target="accy.custom.double", version=1).call
        >>> call.check_call([accy.spec(accy.f32, lane=4)], accy.spec(accy.f32, lane=4))
        >>> call.check_call([accy.spec(accy.f64, lane=4)], accy.spec(accy.f32, lane=4))
        ... # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        accy.kernel.errors.KernelCallMismatch: ... parameter 'x' of dtype f32, but it is f64[lane=4]
        """
        operands = self.operand_parameters
        if len(operand_types) != len(operands):
            names = ", ".join(name for name, _ in operands)
            raise KernelCallMismatch(
                f"{self.where} takes {len(operands)} operands ({names}), but the call gives "
                f"{len(operand_types)}"
            )
        for position, ((name, dtype), given) in enumerate(
            zip(operands, operand_types, strict=True)
        ):
            self._check_binding(name, dtype, given, f"operand {position}")
        self._check_binding(RESULT, self.result_dtype, result_type, "the result")
        self._check_result_covered(result_type)

    def _check_binding(self, name: str, dtype: DType, given: TensorType, role: str) -> None:
        if given.dtype != dtype:
            raise KernelCallMismatch(
                f"{self.where}: {role} is bound to parameter {name!r} of dtype {dtype.name}, "
                f"but it is {given}"
            )
        touched = self.extent_of(name)
        if touched > given.size:
            raise KernelCallMismatch(
                f"{self.where}: the kernel accesses {touched} elements of parameter {name!r}, "
                f"but {role} ({given}) has only {given.size}"
            )

    def _check_result_covered(self, result_type: TensorType) -> None:
        written = self.extent_of(RESULT)
        if written != result_type.size:
            raise KernelCallMismatch(
                f"{self.where}: the kernel writes {written} elements of {RESULT!r}, but the "
                f"result ({result_type}) has {result_type.size}; the rest would be left "
                f"unwritten"
            )

    def run_on_cpu(
        self, operands: Sequence[np.ndarray], result_type: TensorType | None = None
    ) -> np.ndarray:
        """Run the C kernel on NumPy arrays (compiled with the C compiler, cached); for tests.

        Without `result_type` the result is 1-D with the elements the kernel writes.

        >>> import numpy as np
        >>> import accy
        >>> from accy.kernel.examples import custom_double_kernel
        >>> call = custom_double_kernel().create_kernel_call_artifact(
        ...     accy.kernel.Limits.testing, None, target="double", version=1).call
        >>> call.run_on_cpu([np.ones(4, np.float32)], accy.spec(accy.f32, a=2, b=2)).tolist()
        [[2.0, 2.0], [2.0, 2.0]]
        """
        from .cpu import run_on_cpu

        return run_on_cpu(self, operands, result_type)


class KernelCallRegistry:
    """Kernel calls by (target, version), as
    `accy.compile(program, device, kernel_call_registry=...)` takes them.

    >>> import accy
    >>> registry = accy.kernel.KernelCallRegistry()
    >>> registry.lookup("accy.custom.double", 1) is None
    True
    """

    def __init__(self, calls: Iterable[KernelCall] = ()):
        self._calls: dict[tuple[str, int], KernelCall] = {}
        for call in calls:
            self._add(call)

    def __repr__(self) -> str:
        return f"KernelCallRegistry({self.describe()})"

    def __iter__(self) -> Iterator[KernelCall]:
        return iter(self._calls.values())

    def __len__(self) -> int:
        return len(self._calls)

    def __contains__(self, key: object) -> bool:
        return key in self._calls

    def keys(self) -> list[tuple[str, int]]:
        """The registered (target, version) pairs, in registration order.

        >>> KernelCallRegistry().keys()
        []
        """
        return list(self._calls)

    def lookup(self, target: str, version: int) -> KernelCall | None:
        """The kernel registered for `(target, version)`, or None.

        >>> KernelCallRegistry().lookup("accy.custom.double", 1) is None
        True
        """
        return self._calls.get((target, version))

    def require(self, target: str, version: int) -> KernelCall:
        """The kernel for `(target, version)`, or a `KernelCallNotFound` naming what is there.

        >>> KernelCallRegistry().require("accy.custom.double", 1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        accy.kernel.errors.KernelCallNotFound: ... has no kernel; the registry has no kernels
        """
        call = self.lookup(target, version)
        if call is not None:
            return call
        versions = sorted(v for t, v in self._calls if t == target)
        if versions:
            raise KernelCallNotFound(
                f"custom_call {target!r}: no kernel for version {version}; the registry has "
                f"versions {', '.join(map(str, versions))} of it"
            )
        raise KernelCallNotFound(
            f"custom_call {target!r} (version {version}) has no kernel; the registry has "
            f"{self.describe()}"
        )

    def merged(self, other: KernelCallRegistry) -> KernelCallRegistry:
        """A registry with the kernels of both; the same key twice must be the same kernel.

        >>> len(KernelCallRegistry().merged(KernelCallRegistry()))
        0
        """
        return KernelCallRegistry([*self, *other])

    @classmethod
    def combine(cls, *registries: KernelCallRegistry) -> KernelCallRegistry:
        """One registry with the kernels of all of `registries`.

        >>> len(KernelCallRegistry.combine(KernelCallRegistry(), KernelCallRegistry()))
        0
        """
        return cls(call for registry in registries for call in registry)

    def describe(self) -> str:
        """The registered keys, for messages.

        >>> KernelCallRegistry().describe()
        'no kernels'
        """
        if not self._calls:
            return "no kernels"
        return ", ".join(f"{t!r} v{v}" for t, v in sorted(self._calls))

    def _add(self, call: KernelCall) -> None:
        key = (call.target, call.version)
        existing = self._calls.get(key)
        if existing is not None and existing != call:
            raise KernelError(
                f"custom_call {call.target!r} version {call.version} is registered twice, "
                f"with kernels {existing.symbol!r} and {call.symbol!r}"
            )
        for other in self._calls.values():
            # Two kernels with one C symbol cannot be linked into one program.
            if other.symbol == call.symbol and (other.target, other.version) != key:
                raise KernelError(
                    f"kernel {call.symbol!r} is registered for both {other.target!r} "
                    f"v{other.version} and {call.target!r} v{call.version}; its C symbol must "
                    f"be unique, so give one of the Programs another name"
                )
        self._calls[key] = call
