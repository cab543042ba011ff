"""What one invocation does on the device, in order: kernel launches, GEMMs, custom kernels,
host-library steps.

The schedule is made once, when a program is compiled, and captured once as a CUDA graph when
it is first run; it never changes afterwards. What does change from call to call is where the
inputs and outputs live, so no kernel takes their addresses as arguments: every kernel reads
them from a *pointer pool* in device memory, which the graph's first node copies from pinned
host memory that the host fills before each launch. An entry of the pool is an `Address`: one
of the invocation's buffers (or the fragment's own workspace) plus a byte offset. The pool holds
the program's input/output table, one table per iteration of every unrolled scan (the body's
buffers are slices of the outer ones) or one region per scan run as a WHILE node (rewritten on
the device at every iteration by the scan's step kernel), and the pointer arrays of GEMMs.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

WORKSPACE = -1  # Address.source of the fragment's workspace (plan workspace, then scratch)
SCRATCH = -2  # Address.source of the scratch region, which follows the plan's workspace
NUMBER = -3  # Address.source whose base is 0: the entry is the number `offset` itself
POOL = -4  # Address.source of the device pointer pool itself: `offset` bytes into it


@dataclass(frozen=True)
class Address:
    """A device address: buffer `source` (input k, then outputs; or WORKSPACE, SCRATCH) plus
    `offset` bytes.

    >>> Address(2, 16).plus(8)
    Address(source=2, offset=24)
    """

    source: int
    offset: int = 0

    def plus(self, nbytes: int) -> Address:
        return Address(self.source, self.offset + nbytes)

    @property
    def fixed(self) -> bool:
        """Whether the address is the same on every call (inside the fragment's own memory)."""
        return self.source < 0


@dataclass(frozen=True)
class Level:
    """One plan being run: its input/output table starts at pool entry `io` (the table's
    `entries`); its workspace starts at byte `ws` of the fragment's workspace."""

    io: int
    entries: tuple[Address, ...]
    ws: int


@dataclass(frozen=True)
class Launch:
    """A generated kernel, given `(pool + io, workspace + ws, scratch)`."""

    kernel: str
    grid: int
    block: int
    io: int
    ws: int


@dataclass(frozen=True)
class Gemm:
    """`C = op(A) op(B)` in cuBLAS's column-major terms, `batch` times.

    With `arrays` None every address is fixed and batches are `stride_*` elements apart
    (`cublasGemmStridedBatchedEx`); otherwise `arrays` is the pool entry where `batch` A
    pointers start, followed by the B and C pointers (`cublasGemmBatchedEx`).
    """

    dtype: str  # the operands' dtype name: f32, f64, f16 or bf16
    transa: int
    transb: int
    m: int
    n: int
    k: int
    a: Address
    lda: int
    b: Address
    ldb: int
    c: Address
    ldc: int
    batch: int = 1
    stride_a: int = 0
    stride_b: int = 0
    stride_c: int = 0
    arrays: int | None = None
    out: str = ""  # the result's dtype name, when not the operands' (f32 from f16/bf16)
    # A cuBLASLt epilogue (`accy.backends.cuda.epilogues`): its name, "" for none: "bias" (a
    # vector of m values, one per row of C, at `bias`, added to every column), "gelu_aux_bias"
    # (that, then GELU into C, the biased product written to `aux`, laid out as C), "dgelu" (the
    # product times GELU's derivative at `aux`).
    epilogue: str = ""
    bias: Address | None = None
    aux: Address | None = None


@dataclass(frozen=True)
class External:
    """A custom-call kernel (`accy.kernel`), launched on its own grid with fixed pointers."""

    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    arguments: tuple[Address, ...]


@dataclass(frozen=True)
class Library:
    """A host library's step (`accy.kernel.call.LibraryStep`, e.g. cuDNN's fused attention):
    the library enqueues its own work on the capturing stream, with fixed addresses for the
    result, the operands and its scratch."""

    symbol: str
    result: Address
    operands: tuple[Address, ...]
    scratch: Address


@dataclass(frozen=True)
class SetCondition:
    """A one-thread kernel that sets conditional handle `handle` (a number unique in the
    schedule) to the bool whose address is pool entry `io` (negated with `negate`). The
    handle belongs to the graph that holds the `Conditional` of the same number. A scan's
    step kernel (`steps.scan`) has the same signature: `io` is its region of the pool and
    `negate` says "advance" (else start at iteration 0)."""

    kernel: str
    handle: int
    io: int
    negate: bool = False


@dataclass(frozen=True)
class Conditional:
    """A CUDA graph conditional node: `kind` "if" runs `body` once when its handle is
    nonzero; "while" runs it again and again while it is (the body sets the handle again).
    The body is captured into the node's own graph, once: no host round trip per run."""

    kind: str
    handle: int
    body: tuple[Action, ...]


@dataclass(frozen=True)
class Batched:
    """Launches of one kernel that do not depend on each other, as one launch (horizontal
    fusion, like PyTorch's multi-tensor apply): `kernel` is the kernel's batched variant
    (`kernels.Module.batched`), launched on the sum of the members' grids; its table at pool
    entry `io` is [n, first block of each member..., total blocks, each member's table
    pointer..., each member's workspace pointer...], so each block runs the member it falls
    in, with that member's block index, grid, table and workspace."""

    kernel: str
    grid: int
    block: int
    io: int
    members: tuple[Launch, ...]


Action = Launch | Gemm | External | Library | SetCondition | Conditional | Batched

Range = tuple[int, int, int]  # (Address.source, first byte, byte past the last)


@dataclass(frozen=True)
class Access:
    """The memory a step's actions may touch: byte ranges read and written. A `barrier` (a
    step whose memory is not known this way: a scan, a custom call) is ordered with every
    action."""

    reads: tuple[Range, ...] = ()
    writes: tuple[Range, ...] = ()
    barrier: bool = False


BARRIER = Access(barrier=True)


@dataclass
class Schedule:
    """The actions of one invocation and the pointer pool they read."""

    pool: list[Address] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    handles: int = 0
    # The `Access` of each top-level action (its step's), recorded by `steps.emit_plan` while
    # `depth` is 0 (not inside a step): what `batch_launches` may reorder and merge. `depth` is
    # 1 while a top-level step's code runs, more inside the plans of its bodies.
    accesses: list[Access] = field(default_factory=list)
    depth: int = 0
    # Set by `batch_launches`: the actions in plan order, and the (input, output) pairs whose
    # aliasing (a donated input written as an output) the batched order would break.
    serial: list[Action] | None = None
    hazards: tuple[tuple[int, int], ...] = ()

    def table(self, entries: list[Address] | tuple[Address, ...]) -> int:
        """Append `entries` to the pool; the index of the first.

        >>> schedule = Schedule()
        >>> schedule.table([Address(0), Address(1)]), schedule.table([Address(WORKSPACE, 64)])
        (0, 2)
        """
        start = len(self.pool)
        self.pool.extend(entries)
        return start

    def add(self, action: Action) -> None:
        self.actions.append(action)

    def handle(self) -> int:
        """A new conditional handle number."""
        self.handles += 1
        return self.handles - 1

    @contextmanager
    def collect(self) -> Iterator[list[Action]]:
        """Collect the actions added inside the block into the list yielded (a conditional
        node's body), instead of the schedule's own; the pool stays shared.

        >>> schedule = Schedule()
        >>> with schedule.collect() as body:
        ...     schedule.add(Launch("k", 1, 1, 0, 0))
        >>> len(body), len(schedule.actions)
        (1, 0)
        """
        outer, self.actions = self.actions, []
        try:
            yield self.actions
        finally:
            self.actions = outer


# horizontal fusion -------------------------------------------------------------------------


class Kernels(Protocol):
    """What `batch_launches` asks of the module that holds the kernels (`kernels.Module`)."""

    def batchable(self, name: str) -> bool: ...

    def batched(self, name: str) -> str: ...


def batch_launches(schedule: Schedule, program_inputs: int, kernels: Kernels) -> None:
    """Reorder the schedule's top-level actions within their dependences and launch the
    launches of one kernel that are ready together as one `Batched` launch (`kernels` says
    which kernels can be batched and declares their batched variants). Dependences come from
    `schedule.accesses`: two actions are ordered when one writes bytes the other reads or
    writes. Among the ready actions the one first in plan order goes next, with every ready
    launch of its kernel. `schedule.serial` keeps the plan order and `schedule.hazards` the
    input/output pairs that must not alias for the new order (inputs are sources below
    `program_inputs`; see `runtime`).

    >>> s = Schedule()
    >>> a, b = Access(writes=((0, 0, 8),)), Access(writes=((0, 8, 16),))
    >>> for access in (a, b, Access(reads=((0, 0, 16),))):
    ...     s.add(Launch("k", 1, 256, 0, 0))
    ...     s.accesses.append(access)
    >>> class Kernels:
    ...     batchable, batched = (lambda self, name: True), (lambda self, name: name + "_b")
    >>> batch_launches(s, 1, Kernels())
    >>> [type(action).__name__ for action in s.actions]
    ['Batched', 'Launch']
    """
    actions = schedule.actions
    if len(schedule.accesses) != len(actions) or len(actions) < 2:
        return
    predecessors = _predecessors(schedule.accesses)
    order = _batched_order(actions, predecessors, kernels.batchable)
    if len(order) == len(actions):
        return  # nothing merged
    schedule.serial = list(actions)
    schedule.hazards = _hazards(schedule.accesses, order, program_inputs)
    schedule.actions = [_launch_for(schedule, actions, group, kernels) for group in order]


def _predecessors(accesses: list[Access]) -> list[set[int]]:
    """For each action, the earlier actions it must follow directly: the last writer of every
    byte it reads or writes, the readers since of every byte it writes (its other conflicts
    follow transitively), or a barrier on either side."""
    histories: dict[int, _ByteHistory] = {}
    result: list[set[int]] = []
    barrier: int | None = None
    since_barrier: list[int] = []
    for at, access in enumerate(accesses):
        if access.barrier:
            result.append(set(since_barrier) | ({barrier} if barrier is not None else set()))
            barrier, since_barrier = at, []
            histories.clear()
            continue
        before: set[int] = {barrier} if barrier is not None else set()
        for ranges, write in ((access.reads, False), (access.writes, True)):
            for source, start, stop in ranges:
                histories.setdefault(source, _ByteHistory()).conflicts(start, stop, write, before)
        for source, start, stop in access.reads:
            histories[source].read(start, stop, at)
        for source, start, stop in access.writes:
            histories[source].write(start, stop, at)
        result.append(before)
        since_barrier.append(at)
    return result


class _ByteHistory:
    """For the bytes of one buffer, which action wrote them last and which read them since:
    bytes [starts[i], starts[i + 1]) share entry i (the last entry runs to the end). Linear in
    the number of distinct boundaries, not in the number of earlier accesses."""

    def __init__(self) -> None:
        self.starts: list[int] = [0]
        self.writer: list[int | None] = [None]
        self.readers: list[tuple[int, ...]] = [()]

    def _entry_at(self, byte: int) -> int:
        """The entry that starts at `byte` (splitting the one that holds it)."""
        i = bisect.bisect_right(self.starts, byte) - 1
        if self.starts[i] == byte:
            return i
        self.starts.insert(i + 1, byte)
        self.writer.insert(i + 1, self.writer[i])
        self.readers.insert(i + 1, self.readers[i])
        return i + 1

    def _entries(self, start: int, stop: int) -> range:
        first = self._entry_at(start)
        return range(first, self._entry_at(stop))

    def conflicts(self, start: int, stop: int, write: bool, into: set[int]) -> None:
        for i in self._entries(start, stop):
            if self.writer[i] is not None:
                into.add(self.writer[i])
            if write:
                into.update(self.readers[i])

    def read(self, start: int, stop: int, at: int) -> None:
        for i in self._entries(start, stop):
            if not self.readers[i] or self.readers[i][-1] != at:
                self.readers[i] += (at,)

    def write(self, start: int, stop: int, at: int) -> None:
        for i in self._entries(start, stop):
            self.writer[i], self.readers[i] = at, ()


def _batched_order(actions, predecessors, batchable) -> list[list[int]]:
    """Groups of action indices in their new order (see `batch_launches`)."""
    import heapq

    waiting = [len(p) for p in predecessors]
    successors: list[list[int]] = [[] for _ in actions]
    for at, before in enumerate(predecessors):
        for other in before:
            successors[other].append(at)
    ready = [at for at, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    done = [False] * len(actions)
    order: list[list[int]] = []
    known: dict[str, bool] = {}
    while ready:
        at = heapq.heappop(ready)
        if done[at]:
            continue
        group = [at]
        action = actions[at]
        if isinstance(action, Launch):
            if action.kernel not in known:
                known[action.kernel] = batchable(action.kernel)
            if known[action.kernel]:
                group += [
                    other
                    for other in ready
                    if not done[other]
                    and isinstance(actions[other], Launch)
                    and actions[other].kernel == action.kernel
                    and actions[other].block == action.block
                ]
        group.sort()
        for member in group:
            done[member] = True
        order.append(group)
        for member in group:
            for after in successors[member]:
                waiting[after] -= 1
                if waiting[after] == 0:
                    heapq.heappush(ready, after)
    return order


def _hazards(accesses, order, inputs: int) -> tuple[tuple[int, int], ...]:
    """(input, output) pairs (output numbered after the inputs, as Address.source) where an
    action writing the output now runs with or before one reading the input that came before
    it in plan order: were the output the donated input's buffer, the new order would break."""
    position = {at: place for place, group in enumerate(order) for at in group}
    readers: dict[int, list[int]] = {}
    writers: dict[int, list[int]] = {}
    sizes: dict[int, int] = {}  # a donated input is an output's buffer only at equal sizes
    for at, access in enumerate(accesses):
        for source, _, stop in access.reads:
            if 0 <= source < inputs:
                readers.setdefault(source, []).append(at)
                sizes[source] = max(sizes.get(source, 0), stop)
        for source, _, stop in access.writes:
            if source >= inputs:
                writers.setdefault(source, []).append(at)
                sizes[source] = max(sizes.get(source, 0), stop)
    pairs = []
    for source, reads in readers.items():
        for output, writes in writers.items():
            if sizes[source] == sizes[output] and any(
                r < w and position[w] <= position[r] for r in reads for w in writes
            ):
                pairs.append((source, output))
    return tuple(pairs)


def _launch_for(schedule: Schedule, actions, group: list[int], kernels: Kernels) -> Action:
    if len(group) == 1:
        return actions[group[0]]
    members = tuple(actions[at] for at in group)
    firsts = [0]
    for member in members:
        firsts.append(firsts[-1] + member.grid)
    table = [
        Address(NUMBER, len(members)),
        *(Address(NUMBER, first) for first in firsts),
        *(Address(POOL, 8 * member.io) for member in members),
        *(Address(WORKSPACE, member.ws) for member in members),
    ]
    kernel = kernels.batched(members[0].kernel)
    return Batched(kernel, firsts[-1], members[0].block, schedule.table(table), members)
