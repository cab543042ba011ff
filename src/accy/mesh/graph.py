"""A per-device program whose collectives are NCCL steps inside its one CUDA graph.

`graph_plan(program, positions, group)` rewrites the per-device program of one rank for the
CUDA backend: every collective becomes a `custom_call` linked (through the plan's
`registry()`) to an `accy.backends.cuda.collectives.NcclStep`, a host-library step that the
backend captures into the program's CUDA graph with the generated kernels and GEMMs. The whole
step, forward, backward, gradient all-reduces and updates, is then one graph launch per GPU.

- `axis_index` becomes the rank's position (a constant: each rank compiles its own program).
- `all_gather` / `reduce_scatter` along an axis that is not the leading one: the operand is
  transposed to put the axis first (NCCL concatenates and scatters contiguous blocks) and the
  result transposed back; the CUDA lowering fuses those moves where it can.
- `all_to_all`: one step of grouped sends and receives (NCCL has no single call for it), the
  split axis moved first so that each position's block is contiguous, the blocks received cut
  by sender and merged into the concatenated axis.
- `psum` of gradients: **buckets**. Psums over a mesh axis are grouped, in the order their
  operands are produced (the backward pass: last layer first), into buckets of about
  `bucket_bytes` (25 MiB, as PyTorch DDP). Right after the operation that produces its last
  member, the members are packed into one flat array (each at a 256-byte boundary at least: a
  concatenate of the flattened, zero-padded members, one loop that also computes what only
  feeds them, such as a gradient's conversion to f32) and that array is all-reduced by one
  NCCL call on a second stream (`bucket_start`), so that it overlaps the rest of the backward
  pass; the program joins that stream (`bucket_finish`) just before the first operation that
  reads one of the sums. Each member's sum is a slice of the bucket plus the finish's zero
  token (the data dependency that orders readers after the join; x + 0 is x).
- Everything else is re-emitted as it is.

A psum is bucketed when NCCL can add its dtype, its operand is computed by the program (not a
parameter or an output, whose buffers the backend stages through shared scratch, which an
asynchronous read must not see), and `bucket_bytes` is positive. On a mesh axis with buckets
every other collective runs on the second stream too (forked from the program's stream and
joined back at once, so it is still synchronous for the program): one communicator, one stream,
so NCCL sees the axis' calls in one order on every rank (GPT-2's embedding gradient all-gathers
its batch-split updates on the axis its gradients are psum-med on).

A bucket closes when it holds `bucket_bytes`, when the next psum differs in mesh axis or dtype,
or when the next psum's operand is produced after an operation that reads a sum already in the
bucket (its start would come after its finish is needed; this also keeps a psum that depends on
another out of its bucket). Gradients become ready in the order `overlap_order` gives: the
original order, with what only feeds bucketed psums hoisted to run as soon as it can.

`in_graph_reason(program)` says why a program cannot run this way (None when it can): a
collective inside a scan or cond body, or no ordinary operation at all (only collectives: the
segmented path calls NCCL on the caller's arrays directly, without the copies through scratch a
graph would need).

Every rank's plan lists the same collectives in the same order (`GraphPlan.order`): the
programs differ only in the positions `axis_index` gives.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..backends.base import backend_for, compile_artifact
from ..backends.cuda.collectives import NCCL_SUM_TYPES, NcclStep, sum_type_name
from ..backends.cuda.schedule import WORKSPACE, Library
from ..config import config
from ..core import Operation, Program
from ..core.builder import Builder
from ..core.types import TensorType
from ..errors import MeshError
from ..kernel.call import KernelCall, KernelCallRegistry
from .segments import MESH_KINDS, _nested_mesh_kinds

BUCKET_BYTES = 25 * 2**20
"""Default bucket size: PyTorch DDP's `bucket_cap_mb=25`."""

BUCKET_AXIS = "nccl_bucket"
SENDER_AXIS = "nccl_sender"  # an all_to_all's received blocks, by sender
ALIGN_ELEMENTS = 128
"""A bucket member's sum starts at a multiple of this many elements (256 bytes and more)."""


def bucket_offsets(sizes: list[int]) -> tuple[list[int], int]:
    """Where each member of sizes `sizes` starts in its bucket, and the bucket's elements.

    >>> bucket_offsets([1, 300, 5])
    ([0, 128, 512], 517)
    """
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += -(-size // ALIGN_ELEMENTS) * ALIGN_ELEMENTS
    return offsets, (offsets[-1] + sizes[-1]) if sizes else 0


def bucket_bytes_from_env() -> int:
    """`accy.config.nccl_bucket_mb` (`ACCY_NCCL_BUCKET_MB`) in bytes (0: no buckets, every psum
    on the program's stream).

    >>> import accy
    >>> with accy.config.override(nccl_bucket_mb=0.5):
    ...     bucket_bytes_from_env()
    524288
    """
    return int(config.nccl_bucket_mb * 2**20)


@dataclass(frozen=True)
class Bucket:
    """Psums all-reduced together: `members` are the per-device program's psum results (value
    numbers) in the order of their slices in the bucket."""

    index: int
    mesh_axis: str
    dtype: str
    members: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class NcclSite:
    """One custom call of the rewritten program and the NCCL step it links to."""

    target: str
    step: NcclStep
    operand_types: tuple[TensorType, ...]
    result_type: TensorType


@dataclass(frozen=True)
class GraphPlan:
    """The rewritten program, its NCCL steps in program order, and the buckets."""

    program: Program
    sites: tuple[NcclSite, ...]
    buckets: tuple[Bucket, ...]

    @property
    def order(self) -> tuple[str, ...]:
        """What each NCCL step does, in the order the program issues them (the same on every
        rank, or NCCL would deadlock)."""
        return tuple(site.step.describe() for site in self.sites)

    def registry(self) -> KernelCallRegistry:
        """The kernel-call registry that links the program's custom calls to the steps."""
        return KernelCallRegistry(_kernel_call(site) for site in self.sites)


def in_graph_reason(program: Program) -> str | None:
    """Why `program`'s collectives cannot be NCCL steps in its graph; None when they can.

    >>> import accy
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, n=4)],
    ...     lambda b, a: b.emit("psum", [a[0]], {"mesh_axis": "data", "size": 2}))
    >>> in_graph_reason(p)
    'it has only collectives (NCCL is called on its arrays directly)'
    """
    if _nested_mesh_kinds(program):
        return "a collective is inside a scan, cond or while_loop body"
    kinds = {op.kind for op in program.operations}
    if kinds <= {"parameter", *MESH_KINDS}:
        return "it has only collectives (NCCL is called on its arrays directly)"
    return None


def graph_plan(
    program: Program,
    positions: Mapping[str, int],
    group: int,
    bucket_bytes: int = BUCKET_BYTES,
) -> GraphPlan:
    """Rewrite per-device `program` for the rank at `positions` (mesh axis -> position), its
    NCCL steps naming communicator group `group` (see the module docstring).

    >>> import accy
    >>> def body(b, a):
    ...     g = (a[0] * a[0]).sum("n")
    ...     return b.emit("psum", [g], {"mesh_axis": "data", "size": 2}) * 0.5
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, n=4)], body)
    >>> graph_plan(p, {"data": 0}, group=1).order
    ('bucket 0 start: psum over data of 1 arrays, 1 x NCCL_FLOAT32', 'bucket 0 finish (join)')
    """
    reason = in_graph_reason(program)
    if reason is not None:
        raise MeshError(f"program {program.name!r} cannot run inside one CUDA graph: {reason}")
    return _Rewriter(program, positions, group, bucket_bytes).run()


def compile_for_cuda(
    program: Program,
    positions: Mapping[str, int],
    group: int,
    bucket_bytes: int = BUCKET_BYTES,
) -> tuple[GraphPlan, Any]:
    """`graph_plan` and the CUDA backend's artifact of its program (no GPU needed). Where the
    backend staged a bucket's operand or result through its shared scratch (an operand that is
    a view of a parameter), which the second stream must not read while later steps reuse it,
    the program is planned again without buckets.

    >>> import accy
    >>> def body(b, a):  # the psum reads a view of the parameter: staged, so no bucket
    ...     return b.emit("psum", [a[0].rename("n", "m")], {"mesh_axis": "data", "size": 2}) + 1.0
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, n=4)], body)
    >>> graph_plan(p, {"data": 0}, group=1).order[0]
    'bucket 0 start: psum over data of 1 arrays, 4 x NCCL_FLOAT32'
    >>> compile_for_cuda(p, {"data": 0}, group=1)[0].order
    ('psum over data, 4 x NCCL_FLOAT32',)
    """
    plan = graph_plan(program, positions, group, bucket_bytes)
    artifact = compile_artifact(backend_for("cuda"), plan.program, plan.registry())
    if plan.buckets and staged_bucket_steps(artifact):
        plan = graph_plan(program, positions, group, 0)
        artifact = compile_artifact(backend_for("cuda"), plan.program, plan.registry())
    return plan, artifact


def staged_bucket_steps(artifact: Any) -> list[str]:
    """The bucket steps of a compiled CUDA program whose operands or result the backend passes
    through its scratch (empty when every one reads and writes workspace buffers)."""
    staged = []
    for action in artifact.schedule.actions:
        if not isinstance(action, Library):
            continue
        step = artifact.externals[action.symbol].library
        if not (isinstance(step, NcclStep) and step.kind.startswith("bucket_")):
            continue  # another library's step (cuDNN attention, ...), or a collective alone
        if any(a.source != WORKSPACE for a in (action.result, *action.operands)):
            staged.append(step.describe())
    return staged


def _eligible_psums(program: Program, ops: list[Operation], bucket_bytes: int) -> list[int]:
    """Indices in `ops` of the psums that may go into buckets (see the module docstring)."""
    if bucket_bytes <= 0:
        return []
    produced = {r for op in ops for r in op.results}
    kept_whole = set(program.parameters) | set(program.outputs)
    return [
        i
        for i, op in enumerate(ops)
        if op.kind == "psum"
        and sum_type_name(op.type.dtype.name) is not None
        and op.operands[0] in produced
        and op.operands[0] not in kept_whole
    ]


def overlap_order(program: Program, bucket_bytes: int) -> list[Operation]:
    """`program`'s operations (parameters left out) in the order the rewritten program issues
    them: the original order, except that an operation whose results only feed bucketable psums
    (a gradient, its scaling by the learning rate that the SPMD transform moved before the
    psum, ...) runs as soon as its operands are there. So a gradient is ready for its bucket when
    the backward pass makes it, not when the update that reads it comes.

    >>> import accy
    >>> def body(b, a):
    ...     other = a[0].exp().sum("n")  # first in the program, but it feeds no psum
    ...     g = (a[0] * a[0]).sum("n") * 0.5
    ...     return b.emit("psum", [g], {"mesh_axis": "data", "size": 2}) + other
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, n=4)], body)
    >>> [op.kind for op in p.operations if op.kind not in ("parameter", "constant")]
    ['unary', 'reduce', 'mul', 'reduce', 'mul', 'psum', 'add']
    >>> [op.kind for op in overlap_order(p, BUCKET_BYTES) if op.kind != "constant"]
    ['mul', 'reduce', 'mul', 'unary', 'reduce', 'psum', 'add']
    """
    ops = [op for op in program.operations if op.kind != "parameter"]
    eligible = {ops[i].results[0] for i in _eligible_psums(program, ops, bucket_bytes)}
    users: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        for v in op.operands:
            users.setdefault(v, []).append(i)
    outputs = set(program.outputs)
    feeds_only_psums = [False] * len(ops)
    for i in reversed(range(len(ops))):
        results = ops[i].results
        readers = [u for r in results for u in users.get(r, ())]
        feeds_only_psums[i] = (
            bool(eligible)
            and bool(readers)
            and not outputs.intersection(results)
            and all(ops[u].results[0] in eligible or feeds_only_psums[u] for u in readers)
        )
    producer = {r: i for i, op in enumerate(ops) for r in op.results}
    key = [float(i) for i in range(len(ops))]
    for i, op in enumerate(ops):  # a hoisted operation goes just after its last operand
        if feeds_only_psums[i]:
            key[i] = max((key[producer[v]] for v in op.operands if v in producer), default=-1.0)
            key[i] += 1e-6  # after that operand, before the next original operation
    return [ops[i] for i in sorted(range(len(ops)), key=lambda i: (key[i], i))]


def form_buckets(program: Program, bucket_bytes: int) -> list[Bucket]:
    """The buckets of `program`'s psums (see the module docstring), in start order.

    >>> import accy
    >>> def body(b, a):
    ...     g = [b.emit("psum", [(a[0] * float(k)).sum("n")], {"mesh_axis": "data", "size": 2})
    ...          for k in range(3)]
    ...     return g[0] + g[1] + g[2]
    >>> p = accy.trace.define("p", [accy.spec(accy.f32, n=4)], body)
    >>> [(len(b.members), b.nbytes) for b in form_buckets(p, bucket_bytes=8)]
    [(2, 8), (1, 4)]
    """
    ops = overlap_order(program, bucket_bytes)
    producer = {r: i for i, op in enumerate(ops) for r in op.results}
    first_reader: dict[int, int] = {}
    for i, op in enumerate(ops):
        for v in op.operands:
            first_reader.setdefault(v, i)
    eligible = sorted(
        _eligible_psums(program, ops, bucket_bytes),
        key=lambda i: (producer[ops[i].operands[0]], i),
    )
    buckets: list[Bucket] = []
    members: list[int] = []

    def close() -> None:
        if members:
            first = ops[members[0]]
            nbytes = sum(ops[i].type.nbytes for i in members)
            results = tuple(ops[i].results[0] for i in members)
            buckets.append(
                Bucket(
                    len(buckets), first.attrs["mesh_axis"], first.type.dtype.name, results, nbytes
                )
            )
            members.clear()

    for i in eligible:
        op = ops[i]
        if members:
            first = ops[members[0]]
            earliest_read = min(first_reader.get(ops[m].results[0], len(ops)) for m in members)
            if (
                op.attrs["mesh_axis"] != first.attrs["mesh_axis"]
                or op.type.dtype != first.type.dtype
                or producer[op.operands[0]] >= earliest_read
            ):
                close()
        members.append(i)
        if sum(ops[m].type.nbytes for m in members) >= bucket_bytes:
            close()
    close()
    return buckets


class _Rewriter:
    """One walk over the program, emitting the rewritten one (see `graph_plan`)."""

    def __init__(self, program: Program, positions, group: int, bucket_bytes: int):
        self.program, self.positions, self.group = program, dict(positions), group
        self.builder = Builder(f"{program.name}_graph")
        self.env: dict[int, object] = {}
        self.sites: list[NcclSite] = []
        self.order = overlap_order(program, bucket_bytes)
        self.buckets = form_buckets(program, bucket_bytes)
        self.bucket_of = {v: b for b in self.buckets for v in b.members}
        self.overlapped = {b.mesh_axis for b in self.buckets}  # axes using the second stream
        self.bucket_operands: dict[int, list[int]] = {}  # bucket -> its members' operands
        self.waiting: dict[int, list[Bucket]] = {}  # operand value -> buckets it completes
        producer_op = {op.results[0]: op for op in program.operations}
        for bucket in self.buckets:
            operands = [producer_op[v].operands[0] for v in bucket.members]
            self.bucket_operands[bucket.index] = operands
            last = max(operands, key=self._position_of_producer)
            self.waiting.setdefault(last, []).append(bucket)
        self.started: dict[int, object] = {}  # bucket -> its flat result
        self.packed: dict[int, object] = {}  # bucket -> the array it all-reduces

    def _position_of_producer(self, value: int) -> int:
        for position, op in enumerate(self.order):
            if value in op.results:
                return position
        return -1

    def run(self) -> GraphPlan:
        for op in self.program.operations:
            if op.kind == "parameter":
                self.env[op.results[0]] = self.builder.parameter(op.type, op.attrs["index"])
        for op in self.order:
            if op.results[0] in self.bucket_of:
                continue  # its value comes from its bucket's finish
            for value in op.operands:
                self._need(value)
            results = self._emit(op)
            self.env.update(zip(op.results, results, strict=True))
            for value in op.results:
                for bucket in self.waiting.get(value, ()):
                    self._start(bucket)
        for value in self.program.outputs:
            self._need(value)
        outputs = [self.env[v] for v in self.program.outputs]
        return GraphPlan(self.builder.build(outputs), tuple(self.sites), tuple(self.buckets))

    # -- buckets ----------------------------------------------------------------------------

    def _need(self, value: int) -> None:
        """Make `value` available: a bucketed psum's sum is available after its finish."""
        if value in self.env:
            return
        bucket = self.bucket_of[value]
        if bucket.index not in self.started:
            raise MeshError(f"internal: bucket {bucket.index} is read before it is started")
        self._finish(bucket)

    def _start(self, bucket: Bucket) -> None:
        """The members, each flattened and zero-padded to its slot, concatenated into one
        array (one loop that computes each slot where its elements are: a gradient's
        conversion to the bucket's dtype is computed there, not stored apart first), and that
        array all-reduced by one NCCL call into the bucket."""
        b = self.builder
        values = self.bucket_operands[bucket.index]
        types = [self.program.type_of(v) for v in values]
        offsets, total = bucket_offsets([t.size for t in types])
        pieces = []
        for value, t, start, end in zip(values, types, offsets, [*offsets[1:], total], strict=True):
            piece = b.reshape(self.env[value], ((BUCKET_AXIS, t.size),))
            gap = end - start - t.size
            pieces.append(b.pad(piece, BUCKET_AXIS, 0, gap) if gap else piece)
        packed = b.concatenate(pieces, BUCKET_AXIS) if len(pieces) > 1 else pieces[0]
        step = NcclStep(
            "bucket_start",
            self.group,
            bucket.mesh_axis,
            sum_type_name(types[0].dtype.name),
            (total,),
            self._size(bucket),
            bucket=bucket.index,
            offsets=(0,),
        )
        self.started[bucket.index] = self._call(step, [packed], (packed.ty,), packed.ty)
        self.packed[bucket.index] = packed

    def _finish(self, bucket: Bucket) -> None:
        flat = self.started[bucket.index]
        operands = [flat, self.packed[bucket.index]]
        types = tuple(v.ty for v in operands)
        token_type = TensorType(flat.ty.dtype, ())
        step = NcclStep(
            "bucket_finish",
            self.group,
            bucket.mesh_axis,
            sum_type_name(flat.ty.dtype.name),
            (1,),
            self._size(bucket),
            bucket=bucket.index,
        )
        token = self._call(step, operands, types, token_type)
        b = self.builder
        types = [self.program.type_of(value) for value in bucket.members]
        offsets, _ = bucket_offsets([t.size for t in types])
        for value, t, offset in zip(bucket.members, types, offsets, strict=True):
            piece = b.reshape(b.slice(flat, BUCKET_AXIS, offset, offset + t.size), t.named_extents)
            self.env[value] = b.add(piece, token)

    def _size(self, bucket: Bucket) -> int:
        producer = next(op for op in self.program.operations if op.results[0] == bucket.members[0])
        return producer.attrs["size"]

    # -- one operation -----------------------------------------------------------------------

    def _emit(self, op: Operation) -> tuple:
        b = self.builder
        operands = [self.env[v] for v in op.operands]
        if op.kind == "axis_index":
            return (b.full(op.type, self.positions[op.attrs["mesh_axis"]]),)
        if op.kind in ("all_gather", "reduce_scatter"):
            return (self._along_leading_axis(op, operands[0]),)
        if op.kind == "all_to_all":
            return (self._all_to_all(op, operands[0]),)
        if op.kind in ("psum", "ppermute"):
            return (self._single(op, operands[0], op.operand_types[0], op.type),)
        result = b.emit(op.kind, operands, op.attrs)
        return result if isinstance(result, tuple) else (result,)

    def _moved(self, x, axes) -> object:
        """`x` with its axes in the order `axes` (`x` itself when they are already)."""
        axes = tuple(axes)
        return self.builder.transpose(x, axes) if x.ty.axes != axes else x

    def _along_leading_axis(self, op: Operation, x) -> object:
        """all_gather / reduce_scatter with the axis moved first and back."""
        axis, size = op.attrs["axis"], op.attrs["size"]
        t = op.operand_types[0]
        front = self._moved(x, (axis, *(a for a in t.axes if a != axis)))
        extent = t.extent(axis) * size if op.kind == "all_gather" else t.extent(axis) // size
        result_type = front.ty.with_axes(
            (name, extent if name == axis else e) for name, e in front.ty.named_extents
        )
        return self._moved(self._single(op, front, front.ty, result_type), t.axes)

    def _all_to_all(self, op: Operation, x) -> object:
        """all_to_all as one NCCL step of grouped sends and receives: the operand with the
        split axis first, so that block j (contiguous) goes to position j; what arrives is
        the blocks in the senders' order along that axis. Cut into (sender, block) and the
        sender axis moved before the concatenated axis and merged with it (the senders'
        order outermost), then the axes put back in order; the CUDA lowering fuses the moves."""
        b, size = self.builder, op.attrs["size"]
        split, concat = op.attrs["split_axis"], op.attrs["concat_axis"]
        t = op.operand_types[0]
        front = self._moved(x, (split, *(a for a in t.axes if a != split)))
        received = self._single(op, front, front.ty, front.ty)
        if split != concat:
            block = t.extent(split) // size
            rest = [(a, e) for a, e in received.ty.named_extents if a != split]
            senders = b.reshape(received, ((SENDER_AXIS, size), (split, block), *rest))
            moved = [a for a in senders.ty.axes if a != SENDER_AXIS]
            moved.insert(moved.index(concat), SENDER_AXIS)
            senders = self._moved(senders, moved)
            merged = [
                (a, e * size if a == concat else e)
                for a, e in senders.ty.named_extents
                if a != SENDER_AXIS
            ]
            received = b.reshape(senders, tuple(merged))
        return self._moved(received, t.axes)

    def _single(self, op: Operation, x, operand_type: TensorType, result_type: TensorType):
        kind, axis = op.kind, op.attrs["mesh_axis"]
        sums = kind in ("psum", "reduce_scatter")
        if sums:
            datatype = sum_type_name(operand_type.dtype.name)
            if datatype is None:
                raise MeshError(
                    f"{kind} over NCCL: NCCL cannot add {operand_type.dtype.name} values "
                    f"(program {self.program.name!r}); sums need one of "
                    f"{', '.join(sorted(NCCL_SUM_TYPES))}"
                )
            count = result_type.size if kind == "reduce_scatter" else operand_type.size
        else:  # bytes: a whole operand, or one block of an all_to_all's
            blocks = op.attrs["size"] if kind == "all_to_all" else 1
            datatype, count = "NCCL_UINT8", operand_type.nbytes // blocks
        step = NcclStep(
            kind,
            self.group,
            axis,
            datatype,
            (count,),
            op.attrs["size"],
            pairs=tuple(tuple(p) for p in op.attrs.get("perm", ())),
            position=self.positions.get(axis, 0),
            second_stream=axis in self.overlapped,
            site=len(self.sites),
        )
        return self._call(step, [x], (operand_type,), result_type)

    def _call(self, step: NcclStep, operands, types, result_type: TensorType):
        index = len(self.sites)
        target = f"accy.nccl.{self.group}.{index}.{step.kind}"
        self.sites.append(NcclSite(target, step, tuple(types), result_type))
        return self.builder.custom_call(target, 1, operands, result_type)


def _kernel_call(site: NcclSite) -> KernelCall:
    """The `KernelCall` of one site: no kernel, the NCCL step as its library."""
    parameters = [("dst", site.result_type)] + [
        (f"x{k}", t) for k, t in enumerate(site.operand_types)
    ]
    symbol = site.target.replace(".", "_")
    return KernelCall.of_library(
        site.target, symbol, parameters, f"NCCL {site.step.describe()}", site.step
    )


__all__ = [
    "BUCKET_BYTES",
    "Bucket",
    "GraphPlan",
    "NcclSite",
    "bucket_bytes_from_env",
    "bucket_offsets",
    "compile_for_cuda",
    "form_buckets",
    "graph_plan",
    "overlap_order",
    "in_graph_reason",
]
