"""A readable listing of a plan: one line per step, then where each stored value lives."""

from __future__ import annotations

from ..core import Program
from .plan import Plan, Step, build_plan


def _size(nbytes: int) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if nbytes < 1024 or unit == "MiB":
            return f"{nbytes} {unit}" if unit == "bytes" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return f"{nbytes} MiB"


def _name(op) -> str:
    return op.attrs["op"] if op.kind == "unary" else op.kind


def _values(values) -> str:
    return ", ".join(f"%{v}" for v in values) or "nothing"


def _gemm_note(step: Step) -> str:
    gemm = step.detail
    flags = [
        f"{side} {'packed' if m.packed else 'transposed' if m.transposed else 'as is'}"
        for side, m in (("lhs", gemm.lhs), ("rhs", gemm.rhs))
    ]
    batch = f"batch {'x'.join(map(str, gemm.batch_extents))}, " if gemm.batch_extents else ""
    return f"GEMM {batch}m={gemm.m} n={gemm.n} k={gemm.k}; {', '.join(flags)}"


NOTES = {
    "dot": _gemm_note,
    "reduce": lambda step: (
        f"{step.op.attrs['op']} over {', '.join(step.op.attrs['axes'])} ({step.detail.strategy})"
    ),
    "custom_call": lambda step: f"{step.op.attrs['target']} v{step.op.attrs['version']}",
    "pool": lambda step: (
        f"{step.op.attrs['op']} over windows "
        f"{'x'.join(map(str, step.op.attrs['window']))} of {', '.join(step.op.attrs['axes'])}, "
        f"stride {'x'.join(map(str, step.op.attrs['stride']))}, one pass"
    ),
    "scan": lambda step: f"over {step.op.attrs['axis']} x{step.op.attrs['length']}",
    "cond": lambda step: "runs the true branch's plan or the false branch's (below)",
    "while": lambda step: "runs the condition's plan, then the body's while it holds (below)",
}


def _written(plan: Plan, step: Step) -> str:
    # A reduction with an epilogue: its own result (stored, or kept in the loop); the
    # epilogue's results are listed on its lines.
    values = step.op.results if step.epilogue and step.op is not None else step.writes
    return ", ".join(
        f"%{v}: {plan.program.type_of(v)} -> {plan.slots.get(v, 'kept in the loop')}"
        for v in values
    )


def _group_lines(plan: Plan, index: int, step: Step) -> list[str]:
    count, reads = len(step.members), _values(step.reads)
    lines = [f"{index:>3}  group        one loop for {count} steps; reads {reads}"]
    for member in step.members:
        member_line = f"{member.kind} {member.op.kind} {_written(plan, member)}"
        if member.fused:
            member_line += f"; fuses {', '.join(map(_name, member.fused))}"
        lines.append(f"       - {member_line}")
    return lines


def _reductions_lines(plan: Plan, index: int, step: Step) -> list[str]:
    count, reads = len(step.members), _values(step.reads)
    lines = [
        f"{index:>3}  reductions   one pass over the rows for {count} reductions "
        f"({step.detail.strategy}); reads {reads}"
    ]
    for member in step.members:
        op = member.op
        member_line = (
            f"{op.attrs['op']} over {', '.join(op.attrs['axes'])} {_written(plan, member)}"
        )
        if member.fused:
            member_line += f"; fuses {', '.join(map(_name, member.fused))}"
        lines.append(f"       - {member_line}")
    return lines


def _chain_lines(plan: Plan, index: int, step: Step) -> list[str]:
    """A chain: one line for the step, then each phase's lines (a reduction or a set of
    siblings, with its epilogue), indented."""
    count, reads = len(step.members), _values(step.reads)
    lines = [f"{index:>3}  chain        {count} passes over each row in turn; reads {reads}"]
    for k, phase in enumerate(step.members):
        lines += ["    " + line for line in _step_line(plan, f"{index}.{k}", phase).split("\n")]
    return lines


def _epilogue_lines(plan: Plan, step: Step) -> list[str]:
    """One line per loop of a row reduction's epilogue (computed where each result is stored)."""
    lines = []
    for loop in step.epilogue:
        line = f"       - epilogue: {_name(loop.op)} {_written(plan, loop)}"
        if loop.fused:
            line += f"; fuses {', '.join(map(_name, loop.fused))}"
        lines.append(line)
    return lines


def _step_line(plan: Plan, index: int, step: Step) -> str:
    line = _step_text(plan, index, step)
    return "\n  ".join([line, *_epilogue_lines(plan, step)])


def _step_text(plan: Plan, index: int, step: Step) -> str:
    if step.kind == "copy":
        return f"{index:>3}  copy         output {step.output} <- %{step.reads[0]}"
    if step.kind == "group":
        return "\n  ".join(_group_lines(plan, index, step))
    if step.kind == "reductions":
        return "\n  ".join(_reductions_lines(plan, index, step))
    if step.kind == "chain":
        return "\n  ".join(_chain_lines(plan, index, step))
    written = _written(plan, step)
    line = f"{index:>3}  {step.kind:<11}  {step.op.kind} {written}  reads {_values(step.reads)}"
    if step.fused:
        line += f"; fuses {', '.join(map(_name, step.fused))}"
    if step.kind in NOTES:
        line += f"; {NOTES[step.kind](step)}"
    return line


def format_plan(plan: Plan, indent: str = "") -> str:
    """The text of `explain`, each line prefixed by `indent` (the plans of scan bodies, cond
    branches and while_loops nest)."""
    header = (
        f"plan of {plan.program.name!r}: {len(plan.program.operations)} operations, "
        f"{len(plan.steps)} steps, workspace {_size(plan.workspace_bytes)}"
    )
    lines = [indent + header]
    for index, step in enumerate(plan.steps):
        lines.append(indent + "  " + _step_line(plan, index, step))
        for nested in (step.body, *step.branches):
            if nested is not None:
                lines.append(format_plan(nested, indent + "       "))
    return "\n".join(lines)


def explain(program: Program | Plan) -> str:
    """The fused steps and buffers that `program` lowers to, as text.

    >>> import accy
    >>> p = accy.trace.define(
    ...     "softsum", [accy.spec(accy.f32, row=2, col=3)], lambda b, a: a[0].exp().sum("col"))
    >>> print(accy.lower.explain(p))  # doctest: +NORMALIZE_WHITESPACE
    plan of 'softsum': 4 operations, 1 steps, workspace 0 bytes
        0  reduce       reduce %3: f32[row=2] -> output 0  reads %0; fuses exp, constant;
        sum over col (rows)
    """
    plan = program if isinstance(program, Plan) else build_plan(program)
    return format_plan(plan)
