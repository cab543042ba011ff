"""NCCL collectives as host-library steps of a program's CUDA graph.

A collective of a per-device program (`accy.mesh.graph` rewrites each one into a custom call)
links to a `KernelCall` whose `library` is an `NcclStep`. Like cuDNN attention's step, it is an
immutable description; the CUDA runtime gives it fixed addresses, calls `load(ordinal)` once
when the fragment is loaded (the issuer warms the collective up, outside any capture), `bind`s
the issuer to the capturing stream and then `issue`s it: the NCCL call is enqueued under stream
capture and becomes nodes of the per-call graph (NCCL >= 2.9), so a data-parallel step is one
graph launch per GPU with no Python between its parts.

Communicators are runtime objects, not part of a description: `register_group` keeps this
process's (one per mesh axis, with the CuPy and NCCL modules that made them) under a number,
which steps name as `group`.

Kinds of step:

- `psum`, `all_gather`, `reduce_scatter`, `all_to_all`, `ppermute`: one NCCL call (or a group
  of sends and receives: `all_to_all` sends block j of its operand, `counts[0]` bytes, to
  position j and receives position j's into block j of the result) on the bound stream, from
  the operand to the result; with `second_stream`, on the second stream, forked from the
  bound one and joined back at once (its mesh axis has buckets, and a communicator is used
  from one stream only). Gathers, exchanges and permutations move bytes (`NCCL_UINT8`); sums
  use the NCCL type of the dtype (`sum_type_name`).
- `bucket_start`: the psums of its operands (`accy.mesh.graph` gives one, the gradients packed
  into one array) as one NCCL group, on the group's *second stream*: the stream forks from the
  bound one (an event), so inside the graph the all-reduce is a parallel branch that runs while
  the backward pass goes on. The result is the bucket, the operands' sums one after another.
- `bucket_finish`: the bound stream joins the second stream (waits on the bucket's event), then
  zeroes its result, a one-element *token*: the program adds the token to every member it reads
  from the bucket, so what reads a sum runs after the join (the data dependency orders the
  steps), and what the start read, an operand of the finish too, stays allocated until NCCL
  has read it.

Rules NCCL sets for captured collectives, and how they are kept: every rank captures the same
collectives in the same order (every rank runs the same per-device program); one GPU per process;
each communicator is used from one stream only (on a mesh axis with buckets, every collective
goes to the second stream); P2P calls are warmed up before capture (NCCL requires a
previous uncaptured P2P call) and so is every other call, so that NCCL's lazy connection setup
never happens during a capture.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field
from typing import Any

from ...errors import RuntimeUnavailable

NCCL_SUM_TYPES = {
    "f32": "NCCL_FLOAT32",
    "f64": "NCCL_FLOAT64",
    "f16": "NCCL_FLOAT16",
    "bf16": "NCCL_BFLOAT16",
    "i8": "NCCL_INT8",
    "u8": "NCCL_UINT8",
    "i32": "NCCL_INT32",
    "u32": "NCCL_UINT32",
    "i64": "NCCL_INT64",
    "u64": "NCCL_UINT64",
}
"""The NCCL type that sums each accy dtype (by accy's short name)."""

KINDS = (
    "psum",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "ppermute",
    "bucket_start",
    "bucket_finish",
)


def sum_type_name(dtype_name: str) -> str | None:
    """The name of the NCCL type that adds values of accy dtype `dtype_name` (None: none can).

    >>> sum_type_name("bf16"), sum_type_name("bool")
    ('NCCL_BFLOAT16', None)
    """
    return NCCL_SUM_TYPES.get(dtype_name)


@dataclass
class CommunicatorGroup:
    """This process's communicators (mesh axis -> communicator) and the modules that made them
    (`cupy`, `cupy.cuda.nccl`), with the second stream and the bucket events of overlapped
    psums (made when a step is loaded, never during a capture)."""

    cupy: Any
    nccl: Any
    communicators: dict[str, Any]
    second_stream: int = 0
    events: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)

    def stream(self) -> int:
        if not self.second_stream:
            runtime = self.cupy.cuda.runtime
            non_blocking = getattr(runtime, "streamNonBlocking", 1)  # cudaStreamNonBlocking
            self.second_stream = runtime.streamCreateWithFlags(non_blocking)
        return self.second_stream

    def bucket_events(self, mesh_axis: str, bucket: int) -> tuple[int, int]:
        """(fork, done) events of bucket `bucket`: recorded on the bound stream before the
        all-reduce, and on the second stream after it."""
        key = (mesh_axis, bucket)
        if key not in self.events:
            runtime = self.cupy.cuda.runtime
            flags = getattr(runtime, "eventDisableTiming", 2)  # cudaEventDisableTiming
            self.events[key] = (
                runtime.eventCreateWithFlags(flags),
                runtime.eventCreateWithFlags(flags),
            )
        return self.events[key]

    def release(self) -> None:
        """Destroy the events and the second stream (after the GPU has finished with them)."""
        runtime = self.cupy.cuda.runtime
        for fork, done in self.events.values():
            runtime.eventDestroy(fork)
            runtime.eventDestroy(done)
        self.events = {}
        if self.second_stream:
            runtime.streamDestroy(self.second_stream)
            self.second_stream = 0


_GROUPS: dict[int, CommunicatorGroup] = {}
_NUMBERS = itertools.count(1)
_LOCK = threading.Lock()


def register_group(group: CommunicatorGroup) -> int:
    """Keep `group` for the steps that name the returned number.

    >>> number = register_group(CommunicatorGroup(None, None, {}))
    >>> registered_group(number).communicators
    {}
    >>> unregister_group(number)
    """
    with _LOCK:
        number = next(_NUMBERS)
        _GROUPS[number] = group
        return number


def unregister_group(number: int) -> None:
    with _LOCK:
        group = _GROUPS.pop(number, None)
    if group is not None and group.cupy is not None:
        group.release()


def registered_group(number: int) -> CommunicatorGroup:
    with _LOCK:
        group = _GROUPS.get(number)
    if group is None:
        raise RuntimeUnavailable(
            f"NCCL step: communicator group {number} is closed or was never registered; "
            "compile sharded programs with a live accy.mesh.nccl.Distributed"
        )
    return group


@dataclass(frozen=True)
class NcclStep:
    """One NCCL step of a program (see the module docstring). `counts`: elements of `datatype`
    (an NCCL type's name) per operand (a reduce_scatter's: per result); `size`: the devices
    along the mesh axis; `pairs`/`position`: a ppermute's (source, destination)
    positions and this device's; `bucket`: the bucket's number (bucket steps); `second_stream`:
    a single collective issued on the second stream (forked and joined at once) because its mesh
    axis has buckets there; `site`: the step's number in its program (names its events);
    `offsets`: where each member's sum starts in a bucket, in elements."""

    kind: str
    group: int
    mesh_axis: str
    datatype: str
    counts: tuple[int, ...]
    size: int = 1
    bucket: int = -1
    pairs: tuple[tuple[int, int], ...] = ()
    position: int = 0
    second_stream: bool = False
    site: int = 0
    offsets: tuple[int, ...] = ()

    @property
    def scratch_bytes(self) -> int:
        return 0

    def describe(self) -> str:
        """What the step does, for plans and logs.

        >>> NcclStep("bucket_start", 1, "data", "NCCL_FLOAT32", (4, 6), 2, bucket=0,
        ...          offsets=(0, 128)).describe()
        'bucket 0 start: psum over data of 2 arrays, 10 x NCCL_FLOAT32'
        """
        total = f"{sum(self.counts)} x {self.datatype}"
        if self.kind == "bucket_start":
            return (
                f"bucket {self.bucket} start: psum over {self.mesh_axis} of "
                f"{len(self.counts)} arrays, {total}"
            )
        if self.kind == "bucket_finish":
            return f"bucket {self.bucket} finish (join)"
        return f"{self.kind} over {self.mesh_axis}, {total}"

    def load(self, ordinal: int) -> Issuer:
        """The issuer of this step on this process's GPU, warmed up outside any capture."""
        return Issuer(self, registered_group(self.group))


class Issuer:
    """Enqueues one `NcclStep` on the bound stream (see `accy.kernel.call.LibraryStep`)."""

    def __init__(self, step: NcclStep, group: CommunicatorGroup):
        self.step, self.group = step, group
        self.nccl, self.runtime = group.nccl, group.cupy.cuda.runtime
        self.communicator = group.communicators.get(step.mesh_axis)
        self.datatype = getattr(self.nccl, step.datatype)
        self.stream = 0
        if step.kind.startswith("bucket_"):
            self.second = group.stream()
            self.fork, self.done = group.bucket_events(step.mesh_axis, step.bucket)
        elif step.second_stream:
            self.second = group.stream()
            self.fork, self.done = group.bucket_events(step.mesh_axis, -1 - step.site)
        self._warm_up()

    def bind(self, stream: int) -> None:
        self.stream = int(stream)

    def issue(self, dst: int, operands: tuple[int, ...], scratch: int) -> None:
        kind = self.step.kind
        if not self.step.second_stream or kind.startswith("bucket_"):
            getattr(self, "_" + kind)(dst, operands, self.stream)
            return
        # On the second stream, behind the buckets issued before it, and joined back at once.
        runtime = self.runtime
        runtime.eventRecord(self.fork, self.stream)
        runtime.streamWaitEvent(self.second, self.fork, 0)
        getattr(self, "_" + kind)(dst, operands, self.second)
        runtime.eventRecord(self.done, self.second)
        runtime.streamWaitEvent(self.stream, self.done, 0)

    def _warm_up(self) -> None:
        """Run the step once on zeroed buffers of its sizes and wait (every rank loads the same
        steps in the same order, so the warm-up collectives match), so that NCCL connects its
        channels and sets up P2P before any capture."""
        if self.step.kind == "bucket_finish":
            return
        cupy = self.group.cupy
        itemsize = 1 if self.step.datatype == "NCCL_UINT8" else _itemsize(self.step.datatype)
        kind, size = self.step.kind, self.step.size
        scale = size if kind in ("reduce_scatter", "all_to_all") else 1
        operands = [cupy.zeros(max(n * itemsize * scale, 1), cupy.uint8) for n in self.step.counts]
        total = sum(self.step.counts) * itemsize
        if kind == "bucket_start":
            total = (self.step.offsets[-1] + self.step.counts[-1]) * itemsize
        result_bytes = total * size if kind in ("all_gather", "all_to_all") else total
        dst = cupy.zeros(max(result_bytes, 1), cupy.uint8)
        stream = cupy.cuda.Stream(non_blocking=True)
        previous = self.stream
        self.bind(stream.ptr)
        self.issue(dst.data.ptr, tuple(x.data.ptr for x in operands), 0)
        if self.step.kind == "bucket_start":  # join, as the finish would
            self.runtime.streamWaitEvent(stream.ptr, self.done, 0)
        stream.synchronize()
        self.stream = previous

    def _psum(self, dst: int, operands: tuple[int, ...], stream: int) -> None:
        (x,) = operands
        self.communicator.allReduce(
            x, dst, self.step.counts[0], self.datatype, self.nccl.NCCL_SUM, stream
        )

    def _all_gather(self, dst: int, operands: tuple[int, ...], stream: int) -> None:
        (x,) = operands
        self.communicator.allGather(x, dst, self.step.counts[0], self.datatype, stream)

    def _reduce_scatter(self, dst: int, operands: tuple[int, ...], stream: int) -> None:
        (x,) = operands
        self.communicator.reduceScatter(
            x, dst, self.step.counts[0], self.datatype, self.nccl.NCCL_SUM, stream
        )

    def _all_to_all(self, dst: int, operands: tuple[int, ...], stream: int) -> None:
        (x,) = operands
        count = self.step.counts[0]  # bytes of one block
        self.nccl.groupStart()
        try:
            for peer in range(self.step.size):
                self.communicator.send(x + peer * count, count, self.datatype, peer, stream)
                self.communicator.recv(dst + peer * count, count, self.datatype, peer, stream)
        finally:
            self.nccl.groupEnd()

    def _ppermute(self, dst: int, operands: tuple[int, ...], stream: int) -> None:
        (x,) = operands
        count, me = self.step.counts[0], self.step.position
        if all(destination != me for _, destination in self.step.pairs):
            self.runtime.memsetAsync(dst, 0, count, stream)  # no one sends here: zeros
        self.nccl.groupStart()
        try:
            for source, destination in self.step.pairs:
                if source == me:
                    self.communicator.send(x, count, self.datatype, destination, stream)
                if destination == me:
                    self.communicator.recv(dst, count, self.datatype, source, stream)
        finally:
            self.nccl.groupEnd()

    def _bucket_start(self, dst: int, operands: tuple[int, ...], stream: int) -> None:
        """Fork the second stream from the bound one, all-reduce every member into its place in
        the bucket there (one NCCL group), and record the bucket's `done` event."""
        runtime, second = self.runtime, self.second
        runtime.eventRecord(self.fork, stream)
        runtime.streamWaitEvent(second, self.fork, 0)
        itemsize = _itemsize(self.step.datatype)
        self.nccl.groupStart()
        try:
            for x, count, offset in zip(operands, self.step.counts, self.step.offsets, strict=True):
                self.communicator.allReduce(
                    x, dst + offset * itemsize, count, self.datatype, self.nccl.NCCL_SUM, second
                )
        finally:
            self.nccl.groupEnd()
        runtime.eventRecord(self.done, second)

    def _bucket_finish(self, dst: int, operands: tuple[int, ...], stream: int) -> None:
        """Join the second stream, then zero the token (the result)."""
        self.runtime.streamWaitEvent(stream, self.done, 0)
        self.runtime.memsetAsync(dst, 0, _itemsize(self.step.datatype), stream)


_ITEMSIZES = {"NCCL_FLOAT64": 8, "NCCL_INT64": 8, "NCCL_UINT64": 8, "NCCL_FLOAT32": 4}
_ITEMSIZES.update({"NCCL_INT32": 4, "NCCL_UINT32": 4, "NCCL_FLOAT16": 2, "NCCL_BFLOAT16": 2})


def _itemsize(datatype: str) -> int:
    """Bytes of one element of NCCL type `datatype` (by name).

    >>> _itemsize("NCCL_BFLOAT16"), _itemsize("NCCL_UINT8")
    (2, 1)
    """
    return _ITEMSIZES.get(datatype, 1)


__all__ = [
    "KINDS",
    "NCCL_SUM_TYPES",
    "CommunicatorGroup",
    "Issuer",
    "NcclStep",
    "register_group",
    "registered_group",
    "sum_type_name",
    "unregister_group",
]
