"""C loop nests, shared by the CPU and CUDA generators, and the OpenMP pragmas a CPU nest may
carry.

Every parallel region is conditional: after fork() it runs on one thread (the CPU backend's
prelude defines `accy_shared`).
"""

from __future__ import annotations

IF_PARALLEL = "if(accy_shared->parallel)"
PARALLEL = f"#pragma omp parallel {IF_PARALLEL}"
PARALLEL_FOR = f"#pragma omp parallel for schedule(static) {IF_PARALLEL}"
# For loops whose iterations are independent; GCC does not vectorize an OpenMP-outlined loop
# body by itself (the pointers' `restrict` does not survive outlining).
SIMD = "#pragma omp simd"
PARALLEL_FOR_SIMD = f"#pragma omp parallel for simd schedule(static) {IF_PARALLEL}"


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


__all__ = ["IF_PARALLEL", "PARALLEL", "PARALLEL_FOR", "PARALLEL_FOR_SIMD", "SIMD", "nest"]
