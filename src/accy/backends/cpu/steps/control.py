"""cond and while_loop: C control flow around the functions of their sub-programs.

A cond is an `if` on its predicate byte that calls one branch's function: the other branch
does not run. A while_loop calls its condition's function (which writes one byte), breaks when
the byte is zero, and otherwise calls its body's function. Branches and bodies are plans of
their own (`Step.branches`), written by the same code as the entry point and a scan's body.
"""

from __future__ import annotations

from .context import StepContext
from .scan import address, double_buffered_carries


def _call(function: str, arguments: list[str], workspace: str) -> list[str]:
    return [
        f"{{ void *args[] = {{{', '.join(arguments) or '0'}}}; {function}(args, {workspace}); }}"
    ]


def emit_cond(ctx: StepContext) -> list[str]:
    """`if (predicate) true_branch(args) else false_branch(args)`, writing the results."""
    ctx.value_pointers()
    op = ctx.step.op
    on_true, on_false = (ctx.unit.write_function(plan) for plan in ctx.step.branches)
    workspace = ctx.scratch("char", "body")
    predicate = f"(*(const uint8_t *){address(ctx, op.operands[0])} != 0)"
    arguments = [address(ctx, v) for v in op.operands[1:]]
    arguments += [f"(char *){ctx.pointers[r]}" for r in op.results]
    return [
        f"if {predicate}",
        *(f"  {line}" for line in _call(on_true, arguments, workspace)),
        "else",
        *(f"  {line}" for line in _call(on_false, arguments, workspace)),
    ]


def emit_while(ctx: StepContext) -> list[str]:
    """A C loop: the condition's function writes a byte; while it is nonzero, the body's
    function reads the current carries and writes the next ones, and the two swap.

    The carries alternate between the result buffers and scratch (a step never writes what it
    reads); the one that holds the last carries is copied into the result if it is not it.
    """
    ctx.value_pointers()
    op = ctx.step.op
    num_consts = op.attrs["num_consts"]
    condition, body = (ctx.unit.write_function(plan) for plan in ctx.step.branches)
    workspace = ctx.scratch("char", "body")
    predicate = ctx.scratch("uint8_t", "predicate")
    consts = [address(ctx, c) for c in op.operands[:num_consts]]
    carries = list(zip(op.operands[num_consts:], op.results, strict=True))
    lines, current, following = double_buffered_carries(ctx, carries)
    loop = _call(condition, consts + current + [f"(char *){predicate}"], workspace)
    loop.append(f"if (!{predicate}[0]) break;")
    loop += _call(body, consts + current + following, workspace)
    loop += [
        f"{{ char *swap = current{i}; current{i} = next{i}; next{i} = swap; }}"
        for i in range(len(current))
    ]
    lines += ["for (;;) {", *(f"  {line}" for line in loop), "}"]
    for i, result in enumerate(op.results):
        nbytes = ctx.plan.program.type_of(result).nbytes
        pointer = ctx.pointers[result]
        lines.append(
            f"if (current{i} != (char *){pointer}) memcpy({pointer}, current{i}, {nbytes});"
        )
    return lines
