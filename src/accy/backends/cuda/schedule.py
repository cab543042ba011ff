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

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

WORKSPACE = -1  # Address.source of the fragment's workspace (plan workspace, then scratch)
SCRATCH = -2  # Address.source of the scratch region, which follows the plan's workspace


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


Action = Launch | Gemm | External | Library | SetCondition | Conditional


@dataclass
class Schedule:
    """The actions of one invocation and the pointer pool they read."""

    pool: list[Address] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    handles: int = 0

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
