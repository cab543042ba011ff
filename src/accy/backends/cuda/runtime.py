"""A compiled program loaded on a GPU: NVRTC modules, memory, and one CUDA graph per slot.

Loading compiles the CUDA C with NVRTC (`binaries.module`), whose binaries accy's disk cache
keeps under a key of the source, the options, the GPU architecture and the NVRTC and driver
versions, so a program is compiled once per machine.
The program's translation units (`CompiledFragment.units`) are compiled and loaded in parallel
threads (NVRTC is thread-safe and CuPy releases the GIL while it runs).
The workspace and the pointer pool come from CuPy's memory pool.

The first run captures the whole schedule into a CUDA graph: a copy of the pointer pool from
pinned host memory, then every kernel, GEMM, custom kernel and host-library step (cuDNN) in
order; library steps are loaded (plans built, warmed up) when the fragment is. A run fills
the pinned pool with the addresses of this call's buffers and launches the graph: one launch
from Python, on the current CuPy stream. Two slots (two pinned pools, two graphs) let a call be
issued while the previous one is still running; a slot is reused once its last launch has finished.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import AccyError, RuntimeUnavailable
from . import binaries
from .compile import NVRTC_OPTIONS, CompiledFragment, SourceUnit
from .cublas import WORKSPACE_BYTES, Cublas
from .graphs import Driver
from .schedule import (
    NUMBER,
    POOL,
    SCRATCH,
    WORKSPACE,
    Address,
    Batched,
    Conditional,
    External,
    Gemm,
    Launch,
    Library,
    SetCondition,
)

SLOTS = 2


def cupy_module():
    """CuPy, imported on first use (importing accy never imports it)."""
    try:
        import cupy
    except ImportError as error:
        raise RuntimeUnavailable(
            f"the CUDA backend needs CuPy (pip install 'accy[cuda]'): {error}"
        ) from None
    return cupy


class Device:
    """What every fragment on one GPU shares: a cuBLAS handle and the stream graphs are
    captured on."""

    _devices: dict[int, Device] = {}
    _lock = threading.Lock()

    def __init__(self, ordinal: int):
        cupy = cupy_module()
        self.ordinal = ordinal
        self.device = cupy.cuda.Device(ordinal)
        with self.device:
            self.capture_stream = cupy.cuda.Stream(non_blocking=True)
            self._cublas_workspace = cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)
            self.cublas = Cublas(self._cublas_workspace.data.ptr)
        self.body_streams: list[Any] = []  # made by `body_stream`, outside any capture

    def body_stream(self, depth: int) -> Any:
        """The stream that captures the bodies of conditional nodes nested `depth` deep."""
        while len(self.body_streams) <= depth:
            with self.device:
                self.body_streams.append(cupy_module().cuda.Stream(non_blocking=True))
        return self.body_streams[depth]

    @classmethod
    def get(cls, ordinal: int) -> Device:
        with cls._lock:
            if ordinal not in cls._devices:
                cls._devices[ordinal] = cls(ordinal)
            return cls._devices[ordinal]


@dataclass
class Slot:
    """One pinned pointer pool, the graph that reads it, and the event of its last launch."""

    pinned: Any
    table: np.ndarray
    event: Any
    # The graph of the batched schedule (key False) and, once a call's donated buffers made
    # it unsafe, of the schedule in plan order (key True).
    graphs: dict[bool, Any] = field(default_factory=dict)
    launched: bool = False


@dataclass
class Pool:
    """How to fill the pointer pool: entry i is `bases[sources[i]] + offsets[i]`."""

    sources: np.ndarray
    offsets: np.ndarray
    bases: np.ndarray = field(init=False)

    def __post_init__(self):
        self.bases = np.zeros(int(self.sources.max(initial=0)) + 1, np.uint64)


def _pool(compiled: CompiledFragment, count: int) -> Pool:
    sources, offsets = [], []
    for address in compiled.schedule.pool:
        source, offset = _resolve(compiled, address, count)
        sources.append(source)
        offsets.append(offset)
    pool = Pool(np.array(sources, np.intp), np.array(offsets, np.uint64))
    if len(pool.bases) < count + 3:
        pool.bases = np.zeros(count + 3, np.uint64)
    return pool


def _resolve(compiled: CompiledFragment, address: Address, count: int) -> tuple[int, int]:
    """(base index, byte offset) of `address`; base `count` is the workspace, `count + 1`
    zero (numbers), `count + 2` the device pool."""
    if address.source == WORKSPACE:
        return count, address.offset
    if address.source == SCRATCH:
        return count, compiled.scratch_offset + address.offset
    if address.source == NUMBER:
        return count + 1, address.offset
    if address.source == POOL:
        return count + 2, address.offset
    return address.source, address.offset


class CudaFragment:
    """A program loaded on a GPU, run by one graph launch per call (see the module doc)."""

    artifact_format = "cuda_c"

    def __init__(self, compiled: CompiledFragment, ordinal: int = 0, tf32: bool = False):
        cupy = cupy_module()
        self.compiled = compiled
        self.tf32 = tf32  # f32 GEMMs may use TF32 tensor cores (compiled with precision="tf32")
        self.program = compiled.program
        self.parameter_types = self.program.parameter_types
        self.output_types = self.program.output_types
        self.device = Device.get(ordinal)
        self._count = len(self.parameter_types) + len(self.output_types)
        with self.device.device:
            # Compiled and loaded now: nothing may compile or load during a capture. NVRTC
            # compiles the units in threads while this one loads everything else.
            loading = KernelsLoading(compiled, ordinal)
            try:
                # cuDNN builds its plans holding the GIL (about half a second each on a cold
                # start, compiling kernels): the units' threads get into NVRTC, which lets the
                # GIL go, first.
                loading.wait_started()
                self._load_the_rest(cupy, compiled, ordinal)
            finally:
                self._kernels = loading.wait()
        self._pool = _pool(compiled, self._count)
        self._pool.bases[self._count] = self.workspace.data.ptr
        self._pool.bases[self._count + 2] = self._pool_device.data.ptr
        self._inputs = len(self.parameter_types)
        self._hazards = frozenset(compiled.schedule.hazards)
        self._last_hazard: tuple[list[int] | None, bool] = (None, False)
        self._next = 0
        self._lock = threading.Lock()

    def _load_the_rest(self, cupy, compiled: CompiledFragment, ordinal: int) -> None:
        """Everything but the generated kernels: custom kernels' PTX, host-library steps (their
        plans and helper kernels built now, outside any capture), the workspace with its
        constants, the device pool and the slots."""
        self._externals = {
            name: self._load_ptx(cupy, call, ordinal)
            for name, call in compiled.externals.items()
            if call.library is None
        }
        self._libraries = {
            name: call.library.load(ordinal)
            for name, call in compiled.externals.items()
            if call.library is not None
        }
        self.workspace = cupy.empty(max(compiled.workspace_bytes, 1), dtype=cupy.uint8)
        for offset, data in compiled.constants:  # large constants: uploaded once, here
            bytes_ = data.reshape(-1).view(np.uint8)
            self.workspace[offset : offset + bytes_.size].set(bytes_)
        entries = len(compiled.schedule.pool)
        self._pool_device = cupy.empty(max(entries, 1) * 8, dtype=cupy.uint8)
        self._slots = [self._slot(cupy, entries) for _ in range(SLOTS)]

    @staticmethod
    def _load_ptx(cupy, call, ordinal: int):
        """The custom kernel's PTX, loaded; or, where this driver is older than the NVRTC that
        wrote the PTX, its CUDA source compiled for this device."""
        try:
            module = cupy.cuda.function.Module()
            module.load(call.ptx.encode())
        except cupy.cuda.driver.CUDADriverError:
            module = binaries.module(call.cuda_source, NVRTC_OPTIONS, ordinal)
        return module, module.get_function(call.kernel_name)

    @staticmethod
    def _slot(cupy, entries: int) -> Slot:
        pinned = cupy.cuda.alloc_pinned_memory(max(entries, 1) * 8)
        table = np.ndarray((max(entries, 1),), np.uint64, buffer=pinned)[:entries]
        return Slot(pinned, table, cupy.cuda.Event(block=False, disable_timing=True))

    def input_count(self) -> int:
        return len(self.parameter_types)

    def output_count(self) -> int:
        return len(self.output_types)

    def __repr__(self) -> str:
        return (
            f"<CudaFragment {self.program.name!r}: {self.input_count()} in, "
            f"{self.output_count()} out>"
        )

    # running -----------------------------------------------------------------------------

    def run(self, addresses: Sequence[int], stream: Any = None) -> None:
        """Run once on device buffers at `addresses` (inputs, then outputs), on `stream`
        (default: CuPy's current stream). Asynchronous, as any launch."""
        cupy = cupy_module()
        stream = stream if stream is not None else cupy.cuda.get_current_stream()
        with self._lock:
            slot = self._slots[self._next]
            self._next = (self._next + 1) % SLOTS
            if slot.launched:
                slot.event.synchronize()
            pool = self._pool
            pool.bases[: self._count] = addresses
            np.add(pool.bases[pool.sources], pool.offsets, out=slot.table)
            serial = self._aliased_hazard(addresses)
            if serial not in slot.graphs:
                slot.graphs[serial] = self._capture(cupy, slot, serial)
            graph = slot.graphs[serial]
            if graph is not False:
                cupy.cuda.runtime.graphLaunch(graph.graphExec, stream.ptr)
            slot.event.record(stream)
            slot.launched = True

    def release_graphs(self) -> None:
        """Wait for this fragment's launches and destroy its CUDA graphs (the next run captures
        again). A graph that captured NCCL calls keeps their communicator alive: NCCL's
        `ncclCommDestroy` waits until every such graph is destroyed."""
        with self._lock:
            for slot in self._slots:
                if slot.launched:
                    slot.event.synchronize()
                slot.graphs.clear()  # CuPy destroys a graph and its instance when dropped
                slot.launched = False

    def _aliased_hazard(self, addresses: Sequence[int]) -> bool:
        """Whether this call's outputs alias its inputs (donation) in a pair the batched
        schedule reordered (`Schedule.hazards`): then the schedule in plan order runs."""
        if not self._hazards:
            return False
        if addresses == self._last_hazard[0]:  # a training loop: the same buffers every call
            return self._last_hazard[1]
        inputs = {address: k for k, address in enumerate(addresses[: self._inputs])}
        hazard = any(
            (inputs[address], self._inputs + j) in self._hazards
            for j, address in enumerate(addresses[self._inputs :])
            if address in inputs
        )
        self._last_hazard = (list(addresses), hazard)
        return hazard

    def profile(self, addresses: Sequence[int], repeats: int = 20) -> list[tuple[str, float]]:
        """Time each action of the schedule alone: (what the action is, milliseconds per run)
        in schedule order. For finding where a step's time goes; `run` is the fast way to run
        it.

        Each action is captured into a CUDA graph of its own, and that graph replayed `repeats`
        times back to back between two CUDA events, so the host's cost of issuing an action
        (cuBLAS's and cuDNN's calls take tens of microseconds) is not counted, as it is not
        when the whole step runs as one graph. Replayed alone, an action finds operands that
        fit in L2 already there, so small actions run a little faster than inside the step."""
        cupy = cupy_module()
        actions = self.compiled.schedule.actions
        if any(isinstance(action, SetCondition | Conditional) for action in actions):
            raise AccyError(
                f"profile: program {self.program.name!r} has a cond or while_loop, whose "
                "conditional graph nodes run only inside its graph; profile a program "
                "without them, or time the whole call"
            )
        stream = self.device.capture_stream
        with self._lock, self.device.device, stream:
            slot = self._slots[0]
            if slot.launched:
                slot.event.synchronize()
            pool = self._pool
            pool.bases[: self._count] = addresses
            np.add(pool.bases[pool.sources], pool.offsets, out=slot.table)
            self._copy_pool(cupy, slot, stream)
            self._bind(stream.ptr)
            graphs = [self._capture_one(stream, action) for action in actions]
            for graph in graphs:  # the step once, in order: every buffer holds its values
                graph.launch(stream)
            start, stop = cupy.cuda.Event(), cupy.cuda.Event()
            times = []
            for graph in graphs:
                graph.launch(stream)
                start.record(stream)
                for _ in range(repeats):
                    graph.launch(stream)
                stop.record(stream)
                stop.synchronize()
                times.append(cupy.cuda.get_elapsed_time(start, stop) / repeats)
        return [(self._describe(a), t) for a, t in zip(actions, times, strict=True)]

    def _capture_one(self, stream, action):
        """A CUDA graph of `action` alone, captured on `stream`."""
        stream.begin_capture()
        try:
            ISSUERS[type(action)](self, action)
        finally:
            graph = stream.end_capture()
        graph.upload(stream)
        return graph

    def _describe(self, action) -> str:
        if isinstance(action, Launch | Batched):
            return f"{action.kernel} {self.compiled.kernel_comments.get(action.kernel, '')}"
        if isinstance(action, Gemm):
            how = "pointer arrays" if action.arrays is not None else "fixed addresses"
            return f"gemm {action.m}x{action.n}x{action.k} batch {action.batch} ({how})"
        if isinstance(action, Library):
            return f"library step {action.symbol}"
        return f"custom kernel {action.symbol}"

    def _bind(self, stream: int) -> None:
        """Direct cuBLAS and every host-library step to `stream` (before a capture begins)."""
        self.device.cublas.bind(stream)
        for issuer in self._libraries.values():
            issuer.bind(stream)

    def _copy_pool(self, cupy, slot: Slot, stream) -> None:
        """Copy the slot's pinned pointer pool to the device (asynchronously, on `stream`)."""
        if len(slot.table):
            cupy.cuda.runtime.memcpyAsync(
                self._pool_device.data.ptr,
                slot.table.ctypes.data,
                len(slot.table) * 8,
                cupy.cuda.runtime.memcpyHostToDevice,
                stream.ptr,
            )

    def _capture(self, cupy, slot: Slot, serial: bool = False):
        schedule = self.compiled.schedule
        actions = schedule.serial if serial and schedule.serial is not None else schedule.actions
        if not actions:
            return False  # nothing to run: no graph at all
        stream = self.device.capture_stream
        for depth in range(_nesting(actions)):  # created now: no stream is made during capture
            self.device.body_stream(depth)
        with self.device.device, stream:
            self._bind(stream.ptr)
            self._streams = [stream]  # the capturing stream of each conditional depth
            self._handles: dict[int, int] = {}  # schedule handle number -> this graph's handle
            stream.begin_capture()
            try:
                self._copy_pool(cupy, slot, stream)
                for action in actions:
                    ISSUERS[type(action)](self, action)
            finally:
                graph = stream.end_capture()
        graph.upload(stream)
        return graph

    # the four kinds of action -------------------------------------------------------------

    def _address(self, address: Address) -> int:
        """A fixed address (inside the fragment's memory), as a number."""
        if not address.fixed:
            raise AccyError(f"internal: {address} is not fixed, so it cannot be in the graph")
        base, offset = _resolve(self.compiled, address, self._count)
        return int(self._pool.bases[base]) + offset

    def _launch(self, action: Launch) -> None:
        pool = self._pool_device.data.ptr
        workspace = self.workspace.data.ptr
        arguments = (
            np.uint64(pool + 8 * action.io),
            np.uint64(workspace + action.ws),
            np.uint64(workspace + self.compiled.scratch_offset),
        )
        self._kernels[action.kernel]((action.grid,), (action.block,), arguments)

    def _batched(self, action: Batched) -> None:
        workspace = self.workspace.data.ptr
        arguments = (
            np.uint64(self._pool_device.data.ptr + 8 * action.io),
            np.uint64(workspace),
            np.uint64(workspace + self.compiled.scratch_offset),
        )
        self._kernels[action.kernel]((action.grid,), (action.block,), arguments)

    def _gemm(self, action: Gemm) -> None:
        if action.arrays is None:
            a, b, c = (self._address(x) for x in (action.a, action.b, action.c))
        else:
            first = self._pool_device.data.ptr + 8 * action.arrays
            a, b, c = (first + 8 * action.batch * k for k in range(3))
        bias = None if action.bias is None else self._address(action.bias)
        aux = None if action.aux is None else self._address(action.aux)
        self.device.cublas.gemm(action, a, b, c, self.tf32, bias, aux)

    def _external(self, action: External) -> None:
        _, function = self._externals[action.symbol]
        arguments = tuple(np.uint64(self._address(x)) for x in action.arguments)
        function(action.grid, action.block, arguments)

    def _library(self, action: Library) -> None:
        issuer = self._libraries[action.symbol]
        operands = tuple(self._address(x) for x in action.operands)
        issuer.issue(self._address(action.result), operands, self._address(action.scratch))

    # conditional nodes (cond, while_loop): see `graphs` --------------------------------

    def _set_condition(self, action: SetCondition) -> None:
        stream = self._streams[-1]
        if action.handle not in self._handles:  # a handle belongs to its node's graph
            graph = Driver.get().capture(stream.ptr).graph
            self._handles[action.handle] = Driver.get().handle(graph)
        arguments = (
            np.uint64(self._pool_device.data.ptr + 8 * action.io),
            np.uint64(self._handles[action.handle]),
            np.int32(action.negate),
        )
        self._kernels[action.kernel]((1,), (1,), arguments)

    def _conditional(self, action: Conditional) -> None:
        driver = Driver.get()
        outer = self._streams[-1]
        node, body = driver.add_conditional(
            driver.capture(outer.ptr), action.kind, self._handles[action.handle]
        )
        inner = self.device.body_stream(len(self._streams) - 1)
        driver.begin_capture_to(inner.ptr, body)
        self._streams.append(inner)
        try:
            with inner:
                self._bind(inner.ptr)
                for nested in action.body:
                    ISSUERS[type(nested)](self, nested)
        finally:
            self._streams.pop()
            driver.end_capture(inner.ptr)
            self._bind(outer.ptr)
        driver.follow(outer.ptr, node)


def load_kernels(compiled: CompiledFragment, ordinal: int) -> dict[str, Any]:
    """Every kernel of `compiled`, by name: its translation units compiled by NVRTC (or found
    in accy's disk cache) and loaded on GPU `ordinal`, in parallel threads."""
    return KernelsLoading(compiled, ordinal).wait()


class KernelsLoading:
    """The translation units of a fragment, compiled and loaded on GPU `ordinal` in threads
    from the moment it is made (NVRTC is thread-safe and CuPy releases the GIL while it runs),
    so the caller can load everything else meanwhile; `wait` for the kernels by name. With one
    unit or one core, they are loaded when waited for."""

    def __init__(self, compiled: CompiledFragment, ordinal: int):
        self.compiled, self.ordinal = compiled, ordinal
        self.units = [u for u in compiled.units if u.kernels] or [
            SourceUnit(compiled.source, compiled.kernels)
        ]
        self.cupy = cupy_module() if compiled.kernels else None
        self.pool: ThreadPoolExecutor | None = None
        self.futures: list[Any] = []
        self._started = threading.Semaphore(0)  # a release per unit in NVRTC or done
        workers = min(len(self.units), os.cpu_count() or 1)
        self._workers = workers
        if compiled.kernels and workers > 1:
            self.pool = ThreadPoolExecutor(workers, thread_name_prefix="accy-nvrtc")
            self.futures = [self.pool.submit(self._load_unit, unit) for unit in self.units]

    def _load_unit(self, unit: SourceUnit) -> Any:
        signalled = []

        def compiling() -> None:
            signalled.append(True)
            self._started.release()

        try:
            with self.cupy.cuda.Device(self.ordinal):  # the thread makes the context current
                return binaries.module(unit.source, NVRTC_OPTIONS, self.ordinal, compiling)
        finally:
            if not signalled:  # a cache hit, or a failure: started all the same
                self._started.release()

    def wait_started(self, timeout: float = 1.0) -> None:
        """Wait (at most `timeout` seconds in all) until every thread has a unit in NVRTC or
        has finished one; at once where the units load on `wait`."""
        deadline = time.monotonic() + timeout
        for _ in range(self._workers if self.pool is not None else 0):
            if not self._started.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return

    def wait(self) -> dict[str, Any]:
        """The kernels by name, once every unit is loaded (a unit's compile error raised)."""
        compiled = self.compiled
        if not compiled.kernels:  # nothing to compile (a schedule of GEMMs or copies only)
            return {}
        if self.pool is None:
            modules = [self._load_unit(unit) for unit in self.units]
        else:
            try:
                modules = [future.result() for future in self.futures]
            finally:
                self.pool.shutdown(wait=True, cancel_futures=True)
        home = {
            name: module
            for unit, module in zip(self.units, modules, strict=True)
            for name in unit.kernels
        }
        # Kernels declared with the file-scope declarations (set-condition) are in every unit.
        return {name: home.get(name, modules[0]).get_function(name) for name in compiled.kernels}


def _nesting(actions) -> int:
    """How deep conditional nodes nest in `actions` (0 when there are none)."""
    return max(
        (1 + _nesting(a.body) for a in actions if isinstance(a, Conditional)),
        default=0,
    )


ISSUERS = {
    Launch: CudaFragment._launch,
    Batched: CudaFragment._batched,
    Gemm: CudaFragment._gemm,
    External: CudaFragment._external,
    Library: CudaFragment._library,
    SetCondition: CudaFragment._set_condition,
    Conditional: CudaFragment._conditional,
}


def load(compiled: CompiledFragment, ordinal: int = 0) -> CudaFragment:
    """Load `compiled` on GPU `ordinal` (NVRTC compiles it, or accy's disk cache has it)."""
    return CudaFragment(compiled, ordinal)
