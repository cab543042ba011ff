"""Loop nests in C, and when a loop is worth running on several threads.

Axes of extent 1 get no loop (their index is the literal 0). OpenMP is used only where a step's
work is large: entering a parallel region costs microseconds even when it is not taken, so a
small step must not contain one at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from ...codegen.c.loops import nest
from ...core import Operation
from ...core.types import TensorType

PARALLEL_WORK = 1 << 20  # element-operations below which one thread is faster
EXPENSIVE_UNARY = {"exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "logistic"}
EXPENSIVE_UNARY |= {"gelu_tanh", "gelu_tanh_slope"}
# Special functions without vector variants, some of them loops: weigh them heavily.
EXPENSIVE_UNARY |= {"asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh", "erf"}
EXPENSIVE_UNARY |= {"erfc", "lgamma", "erf_inv", "digamma", "trigamma"}


def work_per_element(ops: tuple[Operation, ...]) -> int:
    """A rough count of operations per element: transcendentals weigh more than arithmetic."""
    weight = 1
    for op in ops:
        if op.kind == "unary" and op.attrs["op"] in EXPENSIVE_UNARY or op.kind in ("pow", "atan2"):
            weight += 8
        else:
            weight += 1
    return weight


def worth_threads(elements: int, ops: tuple[Operation, ...]) -> bool:
    """Whether a loop over `elements` computing `ops` pays for a parallel region."""
    return elements * work_per_element(ops) >= PARALLEL_WORK


def axis_loops(type: TensorType, prefix: str = "i", positions=None) -> list[tuple[str, int]]:
    """(counter, extent) for each axis of `type` (or those at `positions`) longer than 1."""
    positions = range(type.rank) if positions is None else positions
    return [(f"{prefix}{p}", type.extents[p]) for p in positions if type.extents[p] != 1]


def axis_index(type: TensorType, prefix: str = "i") -> tuple[str, ...]:
    """The index of `type` whose components are the counters of `axis_loops`."""
    return tuple("0" if n == 1 else f"{prefix}{p}" for p, n in enumerate(type.extents))


Loops = list[tuple[str, int]]

_SUBSCRIPT = re.compile(r"\[([^\[\]]*)\]")  # an innermost subscript
_TERM = re.compile(r"^(\w+)(?: \* (\d+))?$")  # `counter` or `counter * stride`


def _accesses(lines: list[str], counters: set[str]) -> tuple[list[dict[str, int]], set[str]]:
    """Each subscript's stride for each of `counters` (absent: 0), and the counters also used
    otherwise (an iota, a clamp, a bound), which cannot be renumbered."""
    accesses: list[dict[str, int]] = []
    misused: set[str] = set()
    for line in lines:
        while match := _SUBSCRIPT.search(line):  # innermost subscripts first, each then `#`
            strides: dict[str, int] = {}
            for part in match.group(1).split(" + "):
                term = _TERM.match(part)
                if term and term.group(1) in counters:
                    counter, stride = term.group(1), int(term.group(2) or 1)
                    strides[counter] = strides.get(counter, 0) + stride
                else:  # a counter inside anything but `counter * stride` (a clamp, a quotient)
                    misused.update(_names(part) & counters)
            accesses.append(strides)
            line = line[: match.start()] + "#" + line[match.end() :]
        misused.update(_names(line) & counters)  # outside subscripts: a condition, an iota
    return accesses, misused


def _names(text: str) -> set[str]:
    return set(re.findall(r"\w+", text))


def coalesced(loops: Loops, emit: Callable[[dict[str, str]], list[str]]) -> tuple[Loops, list[str]]:
    """The loop nest `loops` (outermost first) with adjacent loops merged into one wherever
    every array access is linear in the merged counter, and the statements `emit` makes for it.

    `emit(components)` returns the loop body's statements with each counter of `loops`
    written as `components[counter]`. A nest over [token, key, batch=64, head=4] whose every
    access walks (batch, head) with one stride becomes a 256-long inner loop: GCC vectorizes
    a 4-long loop with libmvec's 4-lane SSE calls, and an 8- or 16-lane loop with its AVX ones
    (for a masked softmax's `exp`, whose every other vector holds -inf, a slow special case,
    the 4-lane loop cost twice the scalar one). The iteration order is unchanged, so results
    are the same bits.

    >>> from accy.codegen.c.expressions import offset_expression
    >>> def body(c):  # x[i0, i1] = y[i1] * z[i0, i1]
    ...     i = (c["i0"], c["i1"])
    ...     return [f"x[{offset_expression(i, (4, 1))}] = y[{offset_expression(i, (0, 1))}] * "
    ...             f"z[{offset_expression(i, (4, 1))}];"]
    >>> coalesced([("i0", 3), ("i1", 4)], body)  # y is read per i1 alone: no merge
    ([('i0', 3), ('i1', 4)], ['x[i0 * 4 + i1] = y[i1] * z[i0 * 4 + i1];'])
    >>> def body(c):  # x[i0, i1] = z[i0, i1] (z transposed: stride 3 along i1)
    ...     i = (c["i0"], c["i1"])
    ...     return [f"x[{offset_expression(i, (8, 2))}] = z[{offset_expression(i, (12, 3))}];"]
    >>> coalesced([("i0", 3), ("i1", 4)], body)
    ([('i1', 12)], ['x[i1 * 2] = z[i1 * 3];'])
    """
    trial = emit({counter: counter for counter, _ in loops})
    if len(loops) < 2:
        return loops, trial
    accesses, misused = _accesses(trial, {counter for counter, _ in loops})

    def mergeable(outer: tuple[str, int], inner: tuple[str, int]) -> bool:
        # Each step of `outer` moves every access by `inner`'s extent times its `inner` stride.
        if outer[0] in misused or inner[0] in misused:
            return False
        return all(a.get(outer[0], 0) == inner[1] * a.get(inner[0], 0) for a in accesses)

    runs: list[list[tuple[str, int]]] = [[loops[0]]]
    for inner in loops[1:]:
        if mergeable(runs[-1][-1], inner):
            runs[-1].append(inner)
        else:
            runs.append([inner])
    if len(runs) == len(loops):
        return loops, trial
    # A run's counters become its innermost one, running over the product of their extents.
    components = {
        c: ("0" if k < len(run) - 1 else c) for run in runs for k, (c, _) in enumerate(run)
    }
    merged = [(run[-1][0], _product(n for _, n in run)) for run in runs]
    return merged, emit(components)


def _product(extents) -> int:
    result = 1
    for n in extents:
        result *= n
    return result


_DEFINITION = re.compile(r"const [A-Za-z_][\w ]* (t\d+) = (.*);")


def nest_hoisting(
    loops: Loops, lines: list[str], outer_pragma: str | None, inner_pragma: str | None
) -> list[str]:
    """`nest(loops, lines, ...)` with the definitions that do not depend on the innermost
    counter (a mask read once per row of a broadcast) computed before the innermost loop:
    GCC does not vectorize an OpenMP-outlined loop that reads such an invariant, so the whole
    loop ran scalar (and its exps through scalar calls). Same statements, same order.

    >>> body = ["const float t1 = m[i0];", "const float t2 = x[i0 * 4 + i1] * t1;", "y[i1] = t2;"]
    >>> print("\\n".join(nest_hoisting([("i0", 2), ("i1", 4)], body, None, None)))
    for (int64_t i0 = 0; i0 < 2; ++i0) {
      const float t1 = m[i0];
      for (int64_t i1 = 0; i1 < 4; ++i1) {
        const float t2 = x[i0 * 4 + i1] * t1;
        y[i1] = t2;
      }
    }
    """
    blocks = any("{" in line or "}" in line for line in lines)
    if len(loops) < 2 or blocks:  # statements in blocks keep their scopes
        return nest(loops, lines, outer_pragma, inner_pragma)
    varying = {loops[-1][0]}
    outside, inside = [], []
    for line in lines:
        match = _DEFINITION.fullmatch(line.strip())
        if match and not (_names(match.group(2)) & varying):
            outside.append(line)
            continue
        # what this line defines (or, not a definition, may assign) varies too
        varying |= {match.group(1)} if match else _names(line)
        inside.append(line)
    if not outside:
        return nest(loops, lines, outer_pragma, inner_pragma)
    inner = nest(loops[-1:], inside, None, inner_pragma)
    return nest(loops[:-1], outside + inner, outer_pragma)
