"""Loop nests in C, and when a loop is worth running on several threads.

Axes of extent 1 get no loop (their index is the literal 0). OpenMP is used only where a step's
work is large: entering a parallel region costs microseconds even when it is not taken, so a
small step must not contain one at all.
"""

from __future__ import annotations

from ...core import Operation
from ...core.types import TensorType

PARALLEL_WORK = 1 << 20  # element-operations below which one thread is faster
EXPENSIVE_UNARY = {"exp", "log", "log1p", "expm1", "sin", "cos", "tan", "tanh", "logistic"}
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


def nest(
    loops: list[tuple[str, int]],
    inner: list[str],
    outer_pragma: str | None = None,
    inner_pragma: str | None = None,
    bounds: dict[str, tuple[str, str]] | None = None,
) -> list[str]:
    """C loops over `loops` (outermost first) around the statements `inner`.

    `bounds` overrides the range of some counters: counter -> (start, stop) C expressions.

    >>> print("\\n".join(nest([("i", 4)], ["x[i] = 0;"])))
    for (int64_t i = 0; i < 4; ++i) {
      x[i] = 0;
    }
    """
    bounds = bounds or {}
    if len(loops) == 1 and outer_pragma == PARALLEL_FOR and inner_pragma == SIMD:
        outer_pragma, inner_pragma = PARALLEL_FOR_SIMD, None
    lines: list[str] = []
    for depth, (counter, extent) in enumerate(loops):
        pad = "  " * depth
        if depth == 0 and outer_pragma:
            lines.append(pad + outer_pragma)
        if depth == len(loops) - 1 and inner_pragma:
            lines.append(pad + inner_pragma)
        start, stop = bounds.get(counter, ("0", str(extent)))
        lines.append(f"{pad}for (int64_t {counter} = {start}; {counter} < {stop}; ++{counter}) {{")
    pad = "  " * len(loops)
    lines += [pad + line for line in inner]
    lines += ["  " * depth + "}" for depth in reversed(range(len(loops)))]
    return lines


# Every parallel region is conditional: after fork() it runs on one thread (source.PRELUDE).
IF_PARALLEL = "if(accy_shared->parallel)"
PARALLEL = f"#pragma omp parallel {IF_PARALLEL}"
PARALLEL_FOR = f"#pragma omp parallel for schedule(static) {IF_PARALLEL}"
# For loops whose iterations are independent; GCC does not vectorize an OpenMP-outlined loop
# body by itself (the pointers' `restrict` does not survive outlining).
SIMD = "#pragma omp simd"
PARALLEL_FOR_SIMD = f"#pragma omp parallel for simd schedule(static) {IF_PARALLEL}"
