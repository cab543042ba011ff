"""A program compiled for the native CPU (device "cpu"), and the backend that makes it.

One call is one native call, which runs the whole program. `accy_run(buffers, workspace)` takes
the buffers' addresses; `accy_run_arrays(call)` takes NumPy array objects and reads their
addresses itself (`accy.backends.buffers.numpy_data_offset`), which makes the array call cost
little more than the checks of its arguments; that call is a function written for each
executable (`array_call_source`), its arrays named, with no loop. The executable owns one
workspace for the program's intermediates, so calls on one executable are serialized: by a
lock, or, for a short program (`is_short`), by the GIL, which such a program's native call
keeps (releasing and taking back the GIL and a lock would cost more than the call). Separate
executables run concurrently. Every call path holds the `NativeLibrary` it calls into.
"""

from __future__ import annotations

import ctypes
import struct
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...core import Program
from ...errors import DonationError
from ...lower.buffers import donation_aliases
from ..arguments import check_count, exact_source, held_dtype, host_array, is_exact, where
from ..base import CompileOptions, Executable, compile_artifact, register_backend
from ..buffers import addresses_of, check_donated_apart, donated_positions, numpy_data_offset
from ..devices import CPU
from .compile import CompiledFragment, compile_program
from .workspace import aligned_workspace

SHORT_PROGRAM_BYTES = 1 << 20
"""A program whose inputs, outputs and workspace take at most this many bytes, without loops or
custom calls, runs in microseconds: its native call keeps the GIL (`is_short`)."""
LONG_KINDS = frozenset({"scan", "while_loop", "cond", "custom_call"})

IDS_OFFSET = 2 * ctypes.sizeof(ctypes.c_void_p)
"""Where the arrays' ids start in accy_run_arrays's argument (after workspace, data offset)."""


def is_short(compiled: CompiledFragment) -> bool:
    """Whether `compiled` is small enough to run holding the GIL (`SHORT_PROGRAM_BYTES`).

    >>> import accy
    >>> from accy.backends.cpu.compile import compile_program
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, n=2)], lambda b, a: a[0] * 2.0)
    >>> is_short(compile_program(p))
    True
    """
    program = compiled.program
    if any(op.kind in LONG_KINDS for op in program.operations):
        return False
    types = [*program.parameter_types, *program.output_types]
    held = sum(t.size * held_dtype(t).itemsize for t in types)
    return held + compiled.workspace_bytes <= SHORT_PROGRAM_BYTES


class CpuExecutable(Executable):
    """A compiled program loaded into this process (see the module doc).

    >>> import accy, numpy as np
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, n=2)], lambda b, a: a[0] * 2.0)
    >>> twice = accy.compile(p, device="cpu")
    >>> twice(np.array([1, 2], np.float32))[0].tolist()
    [2.0, 4.0]
    >>> out = np.zeros(2, np.float32)
    >>> twice.run_buffers([np.array([3, 4], np.float32)], [out])
    >>> out.tolist()
    [6.0, 8.0]
    """

    device = CPU

    def __init__(self, compiled: CompiledFragment):
        super().__init__(compiled.program)
        self.compiled = compiled
        self.library = compiled.load()
        self.holds_gil = is_short(compiled)
        library = self.library
        self.native_entry = library.run_holding_gil if self.holds_gil else library.run
        ahead = compiled.workspace and compiled.workspace.take()
        workspace = ahead or aligned_workspace(compiled.workspace_bytes)
        self._workspace, self._workspace_address = workspace
        count = self.input_count() + self.output_count()
        self._buffers = (ctypes.c_void_p * max(count, 1))()
        self._buffers_address = ctypes.addressof(self._buffers)
        self._pack_buffers = struct.Struct(f"{count}P").pack_into
        # The one argument of accy_run_arrays: workspace, data offset, then the arrays' ids.
        self._arrays_call = (ctypes.c_void_p * (2 + count))(
            self._workspace_address, numpy_data_offset()
        )
        self._arrays_call_address = ctypes.addressof(self._arrays_call)
        self._pack_ids = struct.Struct(f"{count}P").pack_into
        self.native_arrays_entry = (
            library.run_arrays_holding_gil if self.holds_gil else library.run_arrays
        )
        # accy_run_arrays may be used: this NumPy's array layout was recognized, and there is
        # at least one array (its generated code reads one even when there is none).
        self.takes_arrays = numpy_data_offset() is not None and count > 0
        self._lock = threading.Lock()
        self._call = self._array_call()

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        return self._call(*arrays)

    def run_buffers(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        first = inputs[0] if inputs else outputs[0] if outputs else None
        if self.takes_arrays and type(first) is np.ndarray:  # raw bytes skip the array try
            arrays = self.layout.separate_arrays(inputs, outputs)
            if arrays is not None:
                self.run_arrays(arrays)
                return
        self.run_addresses(self.layout.checked_addresses(inputs, outputs))

    def run_arrays(self, arrays: Sequence[np.ndarray]) -> None:
        """Run on checked NumPy arrays (inputs, then outputs; `takes_arrays` must hold): native
        code reads their addresses itself, one native call."""
        with self._lock:
            self._pack_ids(self._arrays_call, IDS_OFFSET, *map(id, arrays))
            self.native_arrays_entry(self._arrays_call_address)

    def run_checked(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        self.run_addresses(addresses_of([*inputs, *outputs]))

    def run_addresses(self, addresses: Sequence[int]) -> None:
        """Run on checked buffer addresses (inputs, then outputs): one native call."""
        with self._lock:
            self._pack_buffers(self._buffers, 0, *addresses)
            self.native_entry(self._buffers_address, self._workspace_address)

    # -- the call on arrays ---------------------------------------------------------------------

    def array_call(self) -> Callable[..., list[np.ndarray]]:
        """The function `__call__` runs, for callers that keep it (weakly: it lives as long as
        this executable) to skip the method call: `accy.jit`'s and the eager operations' fast
        paths."""
        return self._call

    def _array_call(self) -> Callable[..., list[np.ndarray]]:
        """The function `__call__` runs, made for this executable (`array_call_source`): arrays
        of the right dtype, shape and layout pass with four comparisons each; anything else
        goes through `host_array`'s rule, which raises `InvalidInput` before native code runs.
        A call is then one Python frame and the native call."""
        name, types = self.program.name, self.parameter_types

        def checked(arrays: tuple) -> list[np.ndarray]:
            check_count(name, types, len(arrays))
            pairs = enumerate(zip(arrays, types, strict=True))
            return [host_array(a, t, where(name, i)) for i, (a, t) in pairs]

        namespace: dict[str, Any] = {
            "checked": checked,
            "ndarray": np.ndarray,
            "empty": np.empty,
            "lock": self._lock,
            # The code and memory every call uses must outlive it: the function holds them.
            "holds": (self.library, self._workspace),
        }
        # bf16 arrays (ml_dtypes) hold the very bits native code reads: no conversion.
        namespace["checks"] = [(t.extents, held_dtype(t)) for t in types]
        namespace["made"] = [(t.extents, held_dtype(t)) for t in self.output_types]
        for prefix, kinds in (("i", types), ("o", self.output_types)):
            for k, t in enumerate(kinds):
                namespace[f"{prefix}e{k}"], namespace[f"{prefix}d{k}"] = t.extents, held_dtype(t)
        if self.takes_arrays:
            way = "holding_gil" if self.holds_gil else "locked"
            namespace.update(
                # Each call packs its own argument (workspace, data offset, the arrays' ids):
                # faster than packing into one kept buffer, and calls share no state but the
                # workspace, which the GIL or the lock serializes.
                pack=struct.Struct(f"{2 + len(types) + len(self.output_types)}P").pack,
                workspace=self._workspace_address,
                data_offset=numpy_data_offset(),
                entry=self.native_arrays_entry,
            )
        else:
            way = "addresses"
            namespace.update(
                addresses_of=addresses_of,
                pack=self._pack_buffers,
                buffers=self._buffers,
                entry=self.native_entry,
                arguments=(self._buffers_address, self._workspace_address),
            )
        source = array_call_source(len(types), len(self.output_types), way)
        exec(compile(source, f"<array call of {name!r}>", "exec"), namespace)
        # Taken out of the namespace it runs in, so that the two make no cycle: the function
        # (and the library it holds) goes as soon as this executable does.
        return namespace.pop("call")


def array_call_source(inputs: int, outputs: int, way: str) -> str:
    """The source of the array call on `inputs` arrays making `outputs` outputs, each array
    named (`a0`, `o0`, ...) so that every step is spelled out: the argument rule's check
    (`exact_source`, against the parameter's extents `ie0` and dtype `id0`), each output made
    (`empty(oe0, od0)`) and the ids packed by one call into the call's own argument of
    `accy_run_arrays` (a loop, `map(id, ...)` as star arguments and a list from `map(empty,
    ...)` cost as much again as the whole call of a small program). `way` is how it runs:
    "holding_gil" (the native call keeps the GIL, which serializes the calls), "locked" (the
    executable's lock around the native call), or "addresses" (through the arrays' addresses,
    under the lock). It runs in the namespace `CpuExecutable._array_call` makes.

    >>> print(array_call_source(1, 2, "holding_gil"), end="")
    def call(*arrays, _holds=holds):
        if len(arrays) != 1:
            checked(arrays)
        a0, = arrays
        if not (
            type(a0) is ndarray and a0.dtype == id0 and a0.shape == ie0 and a0.flags.c_contiguous
        ):
            a0, = checked(arrays)
        o0 = empty(oe0, od0)
        o1 = empty(oe1, od1)
        entry(pack(workspace, data_offset, id(a0), id(o0), id(o1)))
        return [o0, o1]
    """
    if inputs + outputs > UNROLLED_ARRAYS:
        return _looping_call_source(way)
    names = [f"a{i}" for i in range(inputs)]
    made = [f"o{k}" for k in range(outputs)]
    unpacked = ", ".join(names) + ("," if inputs == 1 else "")
    exact = [exact_source(n, "ndarray", f"ie{i}", f"id{i}") for i, n in enumerate(names)]
    lines = [
        "def call(*arrays, _holds=holds):",
        f"    if len(arrays) != {inputs}:",
        "        checked(arrays)",  # refuses the count
    ]
    if names:
        lines += [
            f"    {unpacked} = arrays",
            "    if not (",
            *(f"        {'and ' if i else ''}{condition}" for i, condition in enumerate(exact)),
            "    ):",
            f"        {unpacked} = checked(arrays)",
        ]
    lines += [f"    o{k} = empty(oe{k}, od{k})" for k in range(outputs)]
    lines += [f"    {line}" for line in _native_call(way, names + made)]
    lines += [f"    return [{', '.join(made)}]"]
    return "\n".join(lines) + "\n"


UNROLLED_ARRAYS = 64
"""Up to this many arrays (inputs and outputs), the array call names each one; a call of more
loops over them (its source would take tens of milliseconds to compile, and its program runs
long enough that the loop does not matter)."""


def _looping_call_source(way: str) -> str:
    """The array call's source for any number of arrays: loops over them (`checks` holds the
    parameters' (extents, dtype) pairs, `made` the outputs')."""
    lines = [
        "def call(*arrays, _holds=holds):",
        "    if len(arrays) != len(checks):",
        "        checked(arrays)",
        "    for value, (extents, dtype) in zip(arrays, checks):",
        f"        if not ({exact_source('value', 'ndarray', 'extents', 'dtype')}):",
        "            arrays = checked(arrays)",
        "            break",
        "    outputs = [empty(extents, dtype) for extents, dtype in made]",
        *(f"    {line}" for line in _native_call(way, None)),
        "    return outputs",
    ]
    return "\n".join(lines) + "\n"


def _native_call(way: str, names: list[str] | None) -> list[str]:
    """The lines that hand the arrays `names` (None: `arrays` and `outputs`) to native code."""
    listed = "*arrays, *outputs" if names is None else ", ".join(names)
    if way == "addresses":
        run = [f"addresses = addresses_of([{listed}])"]
        return run + ["with lock:", "    pack(buffers, 0, *addresses)", "    entry(*arguments)"]
    ids = f"*map(id, ({listed}))" if names is None else ", ".join(f"id({n})" for n in names)
    run = [f"entry(pack(workspace, data_offset, {ids}))"]
    return ["with lock:", *(f"    {line}" for line in run)] if way == "locked" else run


# NumPy's array flags (`ndarray.flags.num`, its C API's NPY_ARRAY_*): a donated argument must
# be C-contiguous, own its memory and be writable; any other argument C-contiguous.
C_CONTIGUOUS, OWNDATA, WRITEABLE = 0x1, 0x4, 0x400
DONATED_FLAGS = C_CONTIGUOUS | OWNDATA | WRITEABLE


class DonatingExecutable:
    """`executable` called with some inputs donated (`accy.compile(..., donate=...)`): each
    output that the plan lets take a donated input's buffer (`accy.lower.buffers.
    donation_aliases`) is written into that input's array, and that very array is returned.
    A donated array must not be used by the caller afterwards (its values are the output's,
    or garbage if no output took it); it must be a writable C-contiguous NumPy array that owns
    its memory, of exactly the parameter's dtype and extents, else `DonationError`.

    >>> import accy, numpy as np
    >>> t = accy.spec(accy.f32, n=3)
    >>> step = accy.trace.define("sgd", [t, t], lambda b, a: a[0] - a[1] * 0.5)
    >>> update = accy.compile(step, device="cpu", donate=(0,))
    >>> w = np.ones(3, np.float32)
    >>> (new,) = update(w, np.ones(3, np.float32))
    >>> new is w, new.tolist()
    (True, [0.5, 0.5, 0.5])
    """

    def __init__(self, executable: CpuExecutable, donate: Sequence[int]):
        types = executable.parameter_types
        self.executable = executable
        self.program = executable.program
        self.donated = donated_positions(self.program.name, donate, len(types))
        self._sizes = [t.nbytes for t in types]
        self.aliases = donation_aliases(executable.compiled.plan, self.donated)
        self._expected = [(t.extents, held_dtype(t)) for t in types]
        # What `_owned_call` asks of each argument's NumPy flags (`ndarray.flags.num`).
        self._flags = [
            DONATED_FLAGS if i in self.donated else C_CONTIGUOUS for i in range(len(types))
        ]
        self._outputs = [
            (self.aliases.get(k), t.extents, held_dtype(t))
            for k, t in enumerate(executable.output_types)
        ]
        kept = set(self.donated)
        self._kept = [i for i in range(len(types)) if i not in kept]

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        if self.executable.takes_arrays:
            outputs = self._owned_call(arrays)
            if outputs is not None:
                return outputs
        return self._checked_call(arrays)

    def _owned_call(self, arrays: tuple) -> list[np.ndarray] | None:
        """The common call, or None where it does not apply: every argument an array of
        exactly its parameter's dtype and extents, C-contiguous, the donated ones writable and
        each owning its memory, every other one owning its memory too (separate allocations,
        so no argument can share a donated one's memory unless it is the same array). Then
        four comparisons an argument and native code reading the arrays' addresses itself:
        char-gpt's 89 arrays cost tens of microseconds, against hundreds for `_checked_call`'s
        per-argument messages, addresses and overlap sweep."""
        if len(arrays) != len(self._expected):
            return None
        ndarray = np.ndarray
        for a, (extents, dtype), needed in zip(arrays, self._expected, self._flags, strict=True):
            if not (
                type(a) is ndarray
                and a.shape == extents
                and (a.dtype is dtype or a.dtype == dtype)
                and a.flags.num & needed == needed
            ):
                return None
        donated = [arrays[i] for i in self.donated]
        ids = set(map(id, donated))
        if len(ids) != len(donated):
            return None
        for i in self._kept:
            if arrays[i].base is not None or id(arrays[i]) in ids:
                return None
        empty = np.empty
        outputs = [
            arrays[alias] if alias is not None else empty(extents, dtype)
            for alias, extents, dtype in self._outputs
        ]
        self.executable.run_arrays([*arrays, *outputs])
        return outputs

    def _checked_call(self, arrays: tuple) -> list[np.ndarray]:
        """Any call: each argument checked (and converted where it is not donated) with a
        message naming it, the donated ones apart from every other argument's memory."""
        ex, name = self.executable, self.program.name
        types = ex.parameter_types
        if len(arrays) != len(types):
            check_count(name, types, len(arrays))
        inputs = [
            _donated(a, t, where(name, i))
            if i in self.donated
            else host_array(a, t, where(name, i))
            for i, (a, t) in enumerate(zip(arrays, types, strict=True))
        ]
        check_donated_apart(name, addresses_of(inputs), self._sizes, self.donated)
        outputs = [
            inputs[self.aliases[k]] if k in self.aliases else np.empty(t.extents, held_dtype(t))
            for k, t in enumerate(ex.output_types)
        ]
        ex.run_checked(inputs, outputs)
        return outputs

    def __getattr__(self, name: str) -> Any:
        return getattr(self.executable, name)


def _donated(value: Any, t, at: str) -> np.ndarray:
    """A donated argument, checked: the array itself, never a converted copy."""
    expected = held_dtype(t)
    if not (
        is_exact(value, np.ndarray, t.extents, expected)
        and value.flags.writeable
        and value.flags.owndata
    ):
        what = type(value).__name__
        if isinstance(value, np.ndarray):
            what = (
                f"{value.dtype}{list(value.shape)} array"
                + ("" if value.flags.writeable else ", read-only")
                + ("" if value.flags.owndata else ", a view of another array")
                + ("" if value.flags.c_contiguous else ", not C-contiguous")
            )
        raise DonationError(
            f"{at} is donated, so it must be a writable, C-contiguous NumPy array that owns its "
            f"memory, of dtype {expected} and shape {t.extents} (it is overwritten in place); "
            f"got a {what}"
        )
    return value


class CpuBackend:
    """Compiles programs to native shared objects (generated C, the system compiler)."""

    device = "cpu"
    artifact_format = "cpu_object"

    def compile_artifact(
        self, program: Program, kernel_call_registry: Any = None
    ) -> CompiledFragment:
        return compile_program(program, kernel_call_registry)

    def load(self, artifact: CompiledFragment, ordinal: int = 0) -> CpuExecutable:
        return CpuExecutable(artifact)

    def compile(self, program: Program, options: CompileOptions, ordinal: int = 0) -> CpuExecutable:
        return self.load(compile_artifact(self, program, options.kernel_call_registry))

    def donating(self, executable: CpuExecutable, donate: Sequence[int]) -> DonatingExecutable:
        """`executable` taking the memory of inputs `donate` (`accy.compile(..., donate=)`)."""
        return DonatingExecutable(executable, donate)


register_backend(CpuBackend())

__all__ = ["CpuBackend", "CpuExecutable", "DonatingExecutable"]
