"""The backend protocol, the device registry and the one in-memory cache of executables.

A `Backend` compiles a `Program` into an `Executable`. An executable is called two ways:

- with arrays, `executable(*arrays) -> list of arrays` (`accy.compile`'s call): every argument
  passes the one conversion rule of `accy.backends.arguments`;
- with raw buffers, `executable.run_buffers(inputs, outputs)`: buffers are checked as
  `accy.backends.buffers` says and the outputs are written in place; `bind(inputs)` checks the
  inputs once and returns `Bindings` that `launch()` and `read_output(i, buffer)`.

Backends register themselves under a device name (`register_backend`); "reference", "cpu" and
"cuda" are those of accy. `executable_for(program, device, options)` is the way in: it looks the
device up and keeps the executables it made in `CACHE`, keyed by the program's content digest,
the device and the options, so that tracing the same function again reuses its compilation.
The cache holds the `accy.config.executables_max_entries` most recently used executables; an
executable nothing else refers to is then released with everything it owns (its native
library, its workspace).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..caches import Lru, limit
from ..config import config
from ..core import Program
from ..custom import inline_declined, kernel_registry_for
from ..errors import AccyError
from .buffers import Layout, addresses_of, check_readable
from .devices import BACKENDS, CPU, Device, as_device

log = logging.getLogger("accy.caches")

PRECISIONS = ("f32", "tf32")
"""The precisions of f32 GEMMs an executable may be compiled for."""


@dataclass(frozen=True, eq=False)
class CompileOptions:
    """What a compilation depends on besides the program: where custom calls find their
    kernels (`kernel_call_registry`, for native code) and their NumPy implementations
    (`custom_calls`, for the reference evaluator), and the precision of f32 GEMMs
    (`precision`: "f32", exact float32, or "tf32", which lets a GPU use TF32 tensor cores).

    >>> CompileOptions().key()
    (None, None, 'f32')
    >>> CompileOptions(precision="fp8")
    Traceback (most recent call last):
    accy.errors.AccyError: precision 'fp8' is not one of f32, tf32 ...
    """

    kernel_call_registry: Any = None
    custom_calls: Any = None
    precision: str = "f32"

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise AccyError(
                f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)} (f32 GEMMs "
                "in exact float32, or in TF32 on a GPU's tensor cores)"
            )

    def key(self) -> tuple[int | None, int | None, str]:
        """The options' identity in cache keys (registries are compared by identity)."""
        registry, calls = self.kernel_call_registry, self.custom_calls
        return (
            None if registry is None else id(registry),
            None if calls is None else id(calls),
            self.precision,
        )


class Executable:
    """A program compiled for one device (see the module doc); subclasses implement
    `__call__`, and `run_checked` or their own `run_buffers` and `bind`."""

    device: Device = CPU  # each backend's executables set their own

    def __init__(self, program: Program):
        self.program = program
        self.parameter_types = program.parameter_types
        self.output_types = program.output_types
        self.layout = Layout(program.name, self.parameter_types, self.output_types)

    def __call__(self, *arrays: Any) -> list[Any]:
        raise NotImplementedError

    def array_call(self) -> Callable[..., list[Any]]:
        """The function a call on arrays runs (`self(*arrays)` is `self.array_call()(*arrays)`),
        for a caller that keeps it, weakly, to skip the method call: it lives as long as this
        executable (`self` here; a backend whose `__call__` forwards gives the function)."""
        return self

    def run_checked(self, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> None:
        """Run on buffers that `layout` has checked, writing `outputs` in place."""
        raise NotImplementedError

    def run_buffers(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        """Check the buffers (`accy.backends.buffers`), then run once, writing every output.

        >>> import accy, numpy as np
        >>> p = accy.trace.define("twice", [accy.spec(accy.f32, n=2)], lambda b, a: a[0] * 2.0)
        >>> out = bytearray(8)
        >>> accy.compile(p, "reference").run_buffers([np.array([1, 2], np.float32)], [out])
        >>> np.frombuffer(out, np.float32).tolist()
        [2.0, 4.0]
        """
        buffers = self.layout.buffers(inputs, outputs)
        self.layout.check_disjoint(addresses_of(buffers))
        count = self.input_count()
        self.run_checked(buffers[:count], buffers[count:])

    def bind(self, inputs: Sequence[Any]) -> Bindings:
        """Check and bind `inputs`; the bindings `launch()` and `read_output(i, buffer)`."""
        return Bindings(self, inputs)

    def input_count(self) -> int:
        return len(self.parameter_types)

    def output_count(self) -> int:
        return len(self.output_types)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.program.name!r} on {self.device}: "
            f"{self.input_count()} in, {self.output_count()} out>"
        )


def array_call(executable: Any) -> Callable[..., list[Any]]:
    """What calling `executable` (as `accy.compile` returns it) on arrays runs: its
    `array_call()`, or the object itself where it wraps an executable (a donating one).

    >>> import accy
    >>> p = accy.trace.define("twice", [accy.spec(accy.f32, n=2)], lambda b, a: a[0] * 2.0)
    >>> array_call(accy.compile(p, "reference"))([1.0, 2.0])[0].tolist()
    [2.0, 4.0]
    """
    return executable.array_call() if isinstance(executable, Executable) else executable


class Bindings:
    """Inputs bound to an executable in host memory, with output buffers of its own."""

    def __init__(self, executable: Executable, inputs: Sequence[Any]):
        self.executable = executable
        self._inputs = executable.layout.inputs(inputs)
        self._outputs = [np.empty(t.nbytes, dtype=np.uint8) for t in executable.output_types]
        self._launched = False

    def launch(self) -> None:
        """Run the program on the bound inputs."""
        self.executable.run_checked(self._inputs, self._outputs)
        self._launched = True

    def read_output(self, index: int, buffer: Any) -> None:
        """Copy output `index` of the last launch into the writable `buffer`."""
        check_readable(self._launched, index, len(self._outputs))
        layout = self.executable.layout
        lone = Layout(layout.name, (), (layout.output_types[index],))
        (target,) = lone.outputs([buffer])
        target.reshape(-1).view(np.uint8)[...] = self._outputs[index]


class Backend(Protocol):
    """Compiles programs for the devices of one platform (`device`: "cpu", "cuda",
    "reference"); `ordinal` is the device's (a GPU's number, 0 for the others)."""

    device: str

    def compile(
        self, program: Program, options: CompileOptions, ordinal: int = 0
    ) -> Executable: ...


class NativeBackend(Backend, Protocol):
    """A backend that compiles through an artifact (generated code) and loads it."""

    artifact_format: str

    def compile_artifact(self, program: Program, kernel_call_registry: Any = None) -> Any: ...

    def load(self, artifact: Any, ordinal: int = 0) -> Executable: ...


DEVICES: dict[str, Backend] = BACKENDS
"""The backend of each platform (the devices themselves: `accy.backends.devices`)."""


def register_backend(backend: Backend) -> None:
    """Make `backend` the one for its device (a native one also loads its artifact format:
    `native_backend_for`)."""
    DEVICES[backend.device] = backend


def compile_artifact(backend: NativeBackend, program: Program, kernel_call_registry: Any) -> Any:
    """`backend`'s artifact of `program`: custom calls link to the kernels of
    `kernel_call_registry`, else to those of their registered `accy.CustomCall` records."""
    # A call whose record has no kernel for these operands (on this backend) runs as its
    # fallback composition.
    program = inline_declined(program, backend.device)
    registry = kernel_registry_for(program, backend.device, kernel_call_registry)
    return backend.compile_artifact(program, registry)


def backend_for(device: str | Device) -> Backend:
    """The backend registered for `device` (a Device or its name).

    >>> backend_for("tpu")
    Traceback (most recent call last):
    accy.errors.AccyError: unknown device 'tpu'; the devices are cpu, cuda, cuda:N ...
    """
    return as_device(device).backend


def native_backend_for(artifact_format: str) -> NativeBackend:
    """The backend that loads artifacts of `artifact_format`."""
    for backend in DEVICES.values():
        if getattr(backend, "artifact_format", None) == artifact_format:
            return backend  # type: ignore[return-value]
    formats = sorted(f for b in DEVICES.values() if (f := getattr(b, "artifact_format", None)))
    raise AccyError(
        f"no backend loads artifacts of format {artifact_format!r}; the formats are "
        f"{', '.join(formats)}"
    )


class ExecutableCache:
    """The executables made most recently, by (program digest, device, options, the settings
    that change generated code); at most `size` of them, or `accy.config.
    executables_max_entries` when `size` is None (least recently used first out). The
    process's one (`CACHE`) is the registered cache "executables" (`accy.clear_caches()`);
    what else keeps executables (jit, eager operations) holds weak references, so this bound
    is the bound on live executables."""

    def __init__(self, size: int | None = None, name: str | None = None):
        self._entries = Lru(name, "executables_max_entries" if size is None else size)

    @property
    def size(self) -> int | None:
        return limit(self._entries.bound)

    def get(self, program: Program, device: str | Device, options: CompileOptions) -> Executable:
        """The executable of `program` on `device`, compiled unless it is cached."""
        device = as_device(device)
        key = (program.digest, device, options.key(), config.code_key())
        entry = self._entries.get(key)
        if entry is not None:
            return entry[0]
        if self._entries.dropped(key):
            _note_compiled_again(program, device, self.size)
        executable = device.backend.compile(program, options, device.ordinal)
        # The options are held with the entry, so that the ids in its key stay theirs.
        self._entries.put(key, (executable, options))
        return executable

    def derived(self, executable: Any, variant: Hashable, make: Callable[[], Any]) -> Any:
        """The object `make()` builds from `executable` (a donating wrapper), kept as an entry
        of its own under (`executable`, `variant`), so that it lives as long as executables do.

        >>> import accy
        >>> p = accy.trace.define("twice", [accy.spec(accy.f32, n=2)], lambda b, a: a[0] * 2.0)
        >>> e = accy.compile(p, "reference")
        >>> CACHE.derived(e, "same", object) is CACHE.derived(e, "same", object)
        True
        """
        # The entry holds `executable` (through what `make` builds), so its id stays its own.
        key = ("derived", id(executable), variant)
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries.put(key, (make(), executable))
        return entry[0]

    def clear(self) -> None:
        """Forget every executable (each is released once nothing else refers to it)."""
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


_noted = threading.Event()


def _note_compiled_again(program: Program, device: Device, bound: int | None) -> None:
    """Say once per process that the bound on live executables made a program compile again:
    a workload that cycles through more programs than the bound compiles over and over."""
    if not _noted.is_set():
        _noted.set()
        log.warning(
            "accy: compiling program %r for %s again: the executables cache released it, as it "
            "keeps at most accy.config.executables_max_entries = %s executables alive; raise "
            "it (ACCY_EXECUTABLES_MAX_ENTRIES) if programs compile over and over",
            program.name,
            device,
            bound,
        )


CACHE = ExecutableCache(name="executables")


def executable_for(
    program: Program, device: str | Device = CPU, options: CompileOptions | None = None
) -> Executable:
    """The executable of `program` on `device`, from `CACHE` or compiled now.

    >>> import accy
    >>> def make():
    ...     return accy.trace.define("inc", [accy.spec(accy.f32, n=2)], lambda b, a: a[0] + 1.0)
    >>> executable_for(make(), "reference") is executable_for(make(), "reference")
    True
    """
    if not isinstance(program, Program):
        raise AccyError(f"expected a Program (accy.trace.define makes one), got {program!r}")
    return CACHE.get(program, device, options or CompileOptions())


__all__ = [
    "CACHE",
    "DEVICES",
    "Backend",
    "Bindings",
    "CompileOptions",
    "Executable",
    "ExecutableCache",
    "NativeBackend",
    "backend_for",
    "executable_for",
    "native_backend_for",
    "register_backend",
]
