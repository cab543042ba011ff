"""`scan` on the GPU: the body's kernels recorded once per iteration, or once inside a WHILE node.

The body is a plan of its own; its kernels are written once. It runs at a `Level` whose
input/output table holds the constants, the current carries, slice `s` of each scanned input,
the next carries, and slice `s` of each scanned output. Carries alternate between the result
buffer and a scratch buffer, so an iteration never writes what it reads; which one holds the
last carry is known from the length alone. A scanned input whose axis is not outermost is
copied slice by slice into scratch by a kernel that reads the slice's start from its own table.

Two ways to run the iterations, chosen per scan from the size of the graph it would make:

- **Unrolled** (`length * body steps <= config.cuda_unrolled_nodes`): the body is scheduled once per
  iteration, each time with its own table in the pointer pool. No per-iteration overhead
  beyond the body's kernels, and contractions stay cuBLAS GEMMs; but the graph, its capture
  time and its host memory grow with the length (16,384 RNN steps: 8.9 s and 5 GB).
- **One WHILE node** (longer scans, whose body is a flat plan): the body is recorded once, as
  the body of a graph conditional WHILE node (`steps.control`'s machinery). Its table is the
  scan's *region* of the pool, which a one-thread *step kernel* rewrites on the device: before
  the node it sets the iteration counter to 0 and writes iteration 0's table; at the end of
  each iteration it advances the counter, writes the next iteration's table (entry `e` is
  `base[parity][e] + stride[e] * s`) and sets the node's handle to `counter < length`. The
  graph's size does not depend on the length. A node iteration costs about 9 us, so it runs
  `accy.config.cuda_iterations_per_node_iteration` iterations: the body is recorded that many
  times in the node, each copy with its own table, all written by the step kernel; where they do not
  divide the length, the first node iteration's first copies run iteration 0 (idempotent: it
  reads nothing it writes). The body's GEMMs are cuBLAS calls whose
  pointer arrays are entries of the region too (`StepContext.region`, derived from the body's
  table and rewritten with it), unless `cuda_cublas_in_conditionals` is off. Bodies holding
  nested scans, conds, while_loops or custom calls stay unrolled: their steps build pool
  tables of their own from the body's addresses, which a table rewritten on the device
  cannot feed.
"""

from __future__ import annotations

from dataclasses import dataclass

from ....codegen.c.expressions import offset_expression
from ....config import config
from ....core.types import TensorType
from ..context import Region, StepCode, StepContext, launches
from ..kernels import LevelPointer, axis_names, blocks_for, decompose, grid_stride
from ..schedule import WORKSPACE, Address, Conditional, Launch, Level, Schedule, SetCondition
from .common import copy_kernel, indent

# Above this many body steps times iterations a scan is one WHILE node instead of unrolled.
# Unrolled, the RNN gradient (then ~17 nodes per iteration) took 1.2 s to capture at 1024
# iterations and 8.9 s (5 GB of host memory) at 16,384 on the H200. Its bodies are now 3 and
# 2 plan steps: 1024 iterations stay unrolled (cuBLAS, no per-iteration node overhead),
# 16,384 become WHILE nodes. Benchmarks set it to compare the two (bench.loop_kinds). The
# bound is `accy.config.cuda_unrolled_nodes` (default 16,384).
# Steps whose schedules add pool tables derived from the body's addresses (nested loops and
# branches) or host-library calls (not known to be captured inside a conditional body): a
# body holding one of them is always unrolled.
NOT_IN_A_WHILE_NODE = frozenset({"scan", "cond", "while", "custom_call"})
# Scan iterations per iteration of the WHILE node: each node iteration costs about 9 us on the
# H200 (a 1024-step RNN gradient: 18.3 ms as a node against 8.8 unrolled, loops4), so the body
# is recorded this many times inside the node, each copy with its own table in the region
# (`accy.config.cuda_iterations_per_node_iteration`, default 8).

STEP_KERNEL = """extern "C" __device__ void cudaGraphSetConditional(unsigned long long handle,
                                                    unsigned int value);
/* {comment} */
extern "C" __global__ void {name}(void **__restrict__ io, unsigned long long handle,
                                  int advance) {{
  /* io: {copies} tables of the {count} moving entries (one per scan iteration a node iteration
     runs), their bases for even iterations, for odd ones, then the node iteration counter.
     advance == 0: start at node iteration 0; else go to the next. The first {pad} tables of
     node iteration 0 are iteration 0's too (running it again is idempotent: it reads what no
     iteration 0 writes), so that {copies} divide the length. */
  unsigned long long *counter = (unsigned long long *)(io + {counter});
  const unsigned long long i = advance ? *counter + 1ull : 0ull;
  *counter = i;
  const unsigned int more = i < {nodes}ull;
  if (more) {{
    for (long long j = 0; j < {copies}; ++j) {{
      long long it = (long long)i * {copies} + j - {pad};
      if (it < 0) it = 0;
      const unsigned long long s = {step};
      char *const *base = (char *const *)(io + {copies} * {count} + (it & 1) * {count});
      void **table = io + j * {count};
{writes}
    }}
  }}
  cudaGraphSetConditional(handle, more);
}}"""


@dataclass(frozen=True)
class Moving:
    """One pool entry the step kernel rewrites: `even` on even iterations, `odd` on odd ones,
    plus `stride` bytes per position `s` along the scanned axis."""

    even: Address
    odd: Address
    stride: int = 0


def _slice_kernel(ctx: StepContext, x: int, t: TensorType, axis: str) -> str:
    """Copy one slice of `x` (its start in `io[0]`) into contiguous `io[1]`."""
    storage = ctx.storage(x)
    position = t.position(axis)
    sliced = t.without([axis])
    strides = ctx.view(x).strides[:position] + ctx.view(x).strides[position + 1 :]
    names = axis_names(sliced, "q")
    element = offset_expression(names, strides)
    lines = [
        f"const {storage} *__restrict__ source = (const {storage} *)io[0];",
        f"{storage} *__restrict__ target = ({storage} *)io[1];",
        grid_stride("i", sliced.size),
        *indent(decompose("i", sliced.extents, names) + [f"target[i] = source[{element}];"]),
        "}",
    ]
    return ctx.module.kernel(lines, f"step {ctx.index}: scan slice")


def _derived(table: list[Moving], pointer: LevelPointer, offset: int, body_ws: int) -> Moving:
    """A region entry a body step derived (`Region.derive`): `offset` bytes past entry
    `pointer.index` of the body's table (moving with it), or past a byte of its workspace."""
    if pointer.table:
        m = table[pointer.index]
        return Moving(m.even.plus(offset), m.odd.plus(offset), m.stride)
    fixed = Address(WORKSPACE, body_ws + pointer.index + offset)
    return Moving(fixed, fixed)


def _runs_as_while_node(ctx: StepContext) -> bool:
    """Whether this scan runs as one graph WHILE node (see the module doc)."""
    body = ctx.step.body
    if any(step.kind in NOT_IN_A_WHILE_NODE for step in body.steps):
        return False
    return ctx.step.op.attrs["length"] * max(len(body.steps), 1) > config.cuda_unrolled_nodes


def _step_kernel(ctx: StepContext, strides: list[int], copies: int) -> str:
    """The one-thread kernel that starts and advances a WHILE-node scan whose node iteration
    runs `copies` scan iterations (see the module doc)."""
    attrs = ctx.step.op.attrs
    length, count = attrs["length"], len(strides)
    name = ctx.module.fresh(f"{ctx.module.prefix}scan_step")
    writes = [
        f"      table[{e}] = (void *)(base[{e}] + {stride}ll * (long long)s);"
        if stride
        else f"      table[{e}] = (void *)base[{e}];"
        for e, stride in enumerate(strides)
    ]
    nodes = -(-length // copies)
    comment = f"step {ctx.index}: scan step (iteration counter, tables, WHILE handle)"
    ctx.module.declare(
        STEP_KERNEL.format(
            name=name,
            comment=comment,
            count=count,
            copies=copies,
            pad=nodes * copies - length,
            nodes=nodes,
            counter=(copies + 2) * count,
            step=f"{length - 1}ull - (unsigned long long)it" if attrs["reverse"] else "it",
            writes="\n".join(writes) if writes else "      (void)base; (void)table;",
        )
    )
    ctx.module.kernel_names.append(name)
    ctx.module.kernel_comments[name] = comment
    return name


def emit_scan(ctx: StepContext) -> StepCode:
    op, attrs = ctx.step.op, ctx.step.op.attrs
    program = ctx.plan.program
    length, axis = attrs["length"], attrs["axis"]
    num_consts, num_carry = attrs["num_consts"], attrs["num_carry"]
    as_while = _runs_as_while_node(ctx)
    region = Region() if as_while else None
    body = ctx.emit_plan(
        ctx.module,
        ctx.step.body,
        ctx.inside_conditional or ("while" if as_while else ""),
        in_loop=True,
        region=region,
    )
    consts = op.operands[:num_consts]
    inits = op.operands[num_consts : num_consts + num_carry]
    xs = op.operands[num_consts + num_carry :]
    carries = op.results[:num_carry]
    ys = op.results[num_carry:]
    starts = []
    for init, result in zip(inits, carries, strict=True):
        t = program.type_of(result)
        if t.size:
            kernel = copy_kernel(
                ctx,
                ctx.view_expression(init),
                ctx.slot_expression(result),
                ctx.storage(result),
                t.size,
            )
            starts.append((kernel, blocks_for(t.size)))
    slicers = {
        i: _slice_kernel(ctx, x, program.type_of(x), axis)
        for i, x in enumerate(xs)
        if program.type_of(x).position(axis) != 0 and program.type_of(x).size
    }
    finals = []
    if length % 2:
        for i, result in enumerate(carries):
            t = program.type_of(result)
            if t.size:
                partner = f"(ws + {ctx.workspace_scratch(f'carry{i}')})"
                kernel = copy_kernel(
                    ctx, partner, ctx.slot_expression(result), ctx.storage(result), t.size
                )
                finals.append((kernel, blocks_for(t.size)))
    body_ws_offset = ctx.workspace_scratch("body")

    def x_stride(x: int) -> int:
        """Bytes from one slice of scanned input `x` to the next."""
        return ctx.view(x).strides[program.type_of(x).position(axis)] * ctx.itemsize(x)

    def y_stride(y: int) -> int:
        return program.type_of(y).nbytes // length if length else 0

    def addresses(level: Level):
        """(constants, own carries, partner carries) when the scan runs at `level`."""
        own = [ctx.slot_address(level, result) for result in carries]
        partners = [
            Address(WORKSPACE, level.ws + ctx.workspace_scratch(f"carry{i}"))
            for i in range(num_carry)
        ]
        return [ctx.view_address(level, c) for c in consts], own, partners

    def schedule_unrolled(level: Level, schedule: Schedule) -> None:
        launches(*starts)(level, schedule)
        constants, own, partners = addresses(level)
        body_ws = level.ws + body_ws_offset
        for iteration in range(length):
            s = length - 1 - iteration if attrs["reverse"] else iteration
            current, following = (own, partners) if iteration % 2 == 0 else (partners, own)
            slices = []
            for i, x in enumerate(xs):
                start = ctx.view_address(level, x).plus(s * x_stride(x))
                if i in slicers:
                    target = Address(WORKSPACE, level.ws + ctx.workspace_scratch(f"x{i}"))
                    table = schedule.table([start, target])
                    sliced = program.type_of(x).without([axis]).size
                    schedule.add(Launch(slicers[i], blocks_for(sliced), 256, table, level.ws))
                    start = target
                slices.append(start)
            outputs = [ctx.slot_address(level, y).plus(s * y_stride(y)) for y in ys]
            entries = tuple(constants + current + slices + following + outputs)
            body(Level(schedule.table(entries), entries, body_ws), schedule)
        launches(*finals)(level, schedule)

    def moving_entries(level: Level) -> tuple[list[Moving], dict[int, int]]:
        """The region's moving entries in order (the body's table, then a (source, target)
        pair per sliced input), and where each sliced input's pair starts."""
        constants, own, partners = addresses(level)
        body_xs, pairs = [], []
        pair_at = {}
        for i, x in enumerate(xs):
            start = ctx.view_address(level, x)
            moving = Moving(start, start, x_stride(x))
            if i in slicers:
                target = Address(WORKSPACE, level.ws + ctx.workspace_scratch(f"x{i}"))
                pair_at[i] = len(pairs)
                pairs += [moving, Moving(target, target)]
                moving = Moving(target, target)
            body_xs.append(moving)
        table = (
            [Moving(c, c) for c in constants]
            + [Moving(a, b) for a, b in zip(own, partners, strict=True)]
            + body_xs
            + [Moving(b, a) for a, b in zip(own, partners, strict=True)]
            + [Moving(a, a, y_stride(y)) for a, y in zip(addresses_of_ys(level), ys, strict=True)]
        )
        body_size = len(table)
        body_ws = level.ws + body_ws_offset
        derived = [_derived(table, pointer, offset, body_ws) for pointer, offset in region.derived]
        return table + pairs + derived, {i: body_size + at for i, at in pair_at.items()}

    def addresses_of_ys(level: Level) -> list[Address]:
        return [ctx.slot_address(level, y) for y in ys]

    # The region's strides (as `moving_entries` lays it out), known before any level is.
    body_strides = (
        [0] * (num_consts + num_carry)
        + [0 if i in slicers else x_stride(x) for i, x in enumerate(xs)]
        + [0] * num_carry
        + [y_stride(y) for y in ys]
    )
    strides = body_strides + [stride for i in slicers for stride in (x_stride(xs[i]), 0)]
    if region is not None:  # the entries the body's steps derive follow the slice pairs
        region.start = len(strides)
        strides += [body_strides[p.index] if p.table else 0 for p, _ in region.derived]
    copies = max(1, min(config.cuda_iterations_per_node_iteration, length))
    step_kernel = _step_kernel(ctx, strides, copies) if as_while else ""

    def schedule_while(level: Level, schedule: Schedule) -> None:
        launches(*starts)(level, schedule)
        moving, pair_at = moving_entries(level)
        assert [m.stride for m in moving] == strides, "internal: the scan region's layout"
        counter = Address(WORKSPACE, level.ws)  # a placeholder: the step kernel sets it
        count = len(moving)
        at_region = schedule.table(
            [m.even for m in moving] * copies
            + [m.even for m in moving]
            + [m.odd for m in moving]
            + [counter]
        )
        handle = schedule.handle()

        def iterate() -> None:
            for copy in range(copies):  # scan iteration `copy` of the node iteration
                table = at_region + copy * count
                for i, at in pair_at.items():
                    sliced = program.type_of(xs[i]).without([axis]).size
                    grid = blocks_for(sliced)
                    schedule.add(Launch(slicers[i], grid, 256, table + at, level.ws))
                body(Level(table, (), level.ws + body_ws_offset), schedule)
            schedule.add(SetCondition(step_kernel, handle, at_region, negate=True))

        schedule.add(SetCondition(step_kernel, handle, at_region, negate=False))
        with schedule.collect() as actions:
            iterate()
        schedule.add(Conditional("while", handle, tuple(actions)))
        launches(*finals)(level, schedule)

    return schedule_while if as_while else schedule_unrolled
