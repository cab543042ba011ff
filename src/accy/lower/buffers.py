"""Buffer planning: place stored intermediates in one workspace so that memory is reused.

Each intermediate is live from the step that writes it to the last step that reads it. Walking
the steps in order, a step's results (and its scratch) are placed first and only then are the
buffers whose last reader it is released, so a step never writes over its own inputs. Placement
is best fit in a free list of aligned blocks; the workspace is as large as the highest block end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .grouping import SAME_INDEX_KINDS

# Bytes every placed buffer starts at a multiple of: cudaMalloc's own alignment, a few CPU cache
# lines. On the H200 a buffer off a 256-byte boundary is slower to stream: the GPT-2
# cross-entropy gradient, an in-place kernel over 824 MB, took 650 us 64 bytes off one, 475 us
# 128 bytes off, 432 us on it (a plain copy 453 against 437).
ALIGNMENT = 256


def aligned(size: int) -> int:
    """`size` rounded up to whole alignment units (at least one unit).

    >>> aligned(1), aligned(256), aligned(257)
    (256, 256, 512)
    """
    return max(ALIGNMENT, -(-size // ALIGNMENT) * ALIGNMENT)


@dataclass
class Arena:
    """A best-fit free list over a region that grows when nothing fits."""

    end: int = 0
    free: list[tuple[int, int]] = field(default_factory=list)

    def allocate(self, size: int) -> int:
        size = aligned(size)
        candidates = [(n, offset) for offset, n in self.free if n >= size]
        if candidates:
            n, offset = min(candidates)
            self.free.remove((offset, n))
            if n > size:
                self.free.append((offset + size, n - size))
            return offset
        if self.free and self.free[-1][0] + self.free[-1][1] == self.end:
            # Grow the block that ends the region rather than leaving it stranded.
            offset, n = self.free.pop()
            self.end = offset + size
            return offset
        offset, self.end = self.end, self.end + size
        return offset

    def release(self, offset: int, size: int) -> None:
        self.free.append((offset, aligned(size)))
        self.free.sort()
        merged: list[tuple[int, int]] = []
        for start, n in self.free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((start, n))
        self.free = merged


@dataclass(frozen=True)
class Lifetime:
    """One buffer to place: its key, size in bytes, first step and last step (inclusive)."""

    key: object
    nbytes: int
    first: int
    last: int


def place(lifetimes: list[Lifetime], step_count: int) -> tuple[dict[object, int], int]:
    """Offsets for each lifetime's key, and the workspace size in bytes.

    >>> offsets, size = place([Lifetime("a", 100, 0, 0), Lifetime("b", 100, 1, 1)], 2)
    >>> offsets["a"] == offsets["b"], size
    (True, 256)
    """
    arena = Arena()
    offsets: dict[object, int] = {}
    starting: dict[int, list[Lifetime]] = {}
    ending: dict[int, list[Lifetime]] = {}
    for life in lifetimes:
        starting.setdefault(life.first, []).append(life)
        ending.setdefault(life.last, []).append(life)
    for step in range(step_count):
        for life in starting.get(step, ()):
            offsets[life.key] = arena.allocate(life.nbytes)
        for life in ending.get(step, ()):
            arena.release(offsets[life.key], life.nbytes)
    return offsets, arena.end


# donation ------------------------------------------------------------------------------------


def donation_aliases(plan: Any, donated: Sequence[int]) -> dict[int, int]:
    """Which outputs may be written into the buffer of a donated input: output position ->
    input index (each donated input serves at most one output). `plan` is an
    `accy.lower.plan.Plan`; the code it generates is unchanged, the caller simply passes the
    input's buffer as the output's.

    An output takes a donated input of the same type when nothing reads the input after the
    step that writes the output, or when that step is a flat loop (or group of loops) that reads
    the input only at the element it writes: every fused operation that depends on the input is
    elementwise over the output's axes, and the output depends on it, so each element of the
    input is loaded (once, into a temporary) before the output's element is stored over it.
    That is a training step's `p - lr * g` and Adam's moments updated in place.

    >>> import accy
    >>> from accy.lower import build_plan
    >>> t = accy.spec(accy.f32, n=4)
    >>> p = accy.trace.define("sgd", [t, t], lambda b, a: (a[0] - a[1] * 0.1, a[1].sum()))
    >>> donation_aliases(build_plan(p), [0]), donation_aliases(build_plan(p), [1])
    ({0: 0}, {})
    """
    program = plan.program
    parameters, outputs = program.parameters, program.outputs
    writer: dict[int, int] = {}
    last_read: dict[int, int] = {}
    copied = {step.output for step in plan.steps if step.output is not None}
    for index, step in enumerate(plan.steps):
        for value in step.writes:
            writer.setdefault(value, index)
        for value in step.reads:
            last_read[value] = index

    def in_place(position: int, input_index: int) -> bool:
        value, source = outputs[position], parameters[input_index]
        return last_read.get(source, -1) == writer[value] and reads_in_place(
            plan.steps[writer[value]], source, value, program.type_of(value).named_extents
        )

    def after_last_read(position: int, input_index: int) -> bool:
        return last_read.get(parameters[input_index], -1) < writer[outputs[position]]

    aliases: dict[int, int] = {}
    free = list(dict.fromkeys(donated))
    # Updates in place first (`p - lr * g` into p's buffer), then any output into any input
    # read before it is written: so an output of the same type that merely comes first (a
    # scalar loss) does not take the buffer of the input that another output updates (a step
    # count), which would leave that update a new buffer on every call.
    for fits in (in_place, after_last_read):
        for position, value in enumerate(outputs):
            if position in copied or position in aliases or value not in writer:
                continue  # a copy (of an input, or of an output written once already)
            for input_index in free:
                same_type = program.type_of(parameters[input_index]) == program.type_of(value)
                if same_type and fits(position, input_index):
                    aliases[position] = input_index
                    free.remove(input_index)
                    break
    return aliases


def reads_in_place(step: Any, source: int, value: int, extents: tuple) -> bool:
    """Whether flat loop `step` reads `source` only at the element of `value` it writes, and
    reads it before that element is stored (see `donation_aliases`)."""
    if step.kind not in ("loop", "group"):
        return False
    operations = [*step.fused, *(m.op for m in step.members)] if step.members else []
    operations = operations or [*step.fused, step.op]
    depends = {source}
    for op in operations:
        if op is None or not depends.intersection(op.operands):
            continue
        if op.kind not in SAME_INDEX_KINDS:
            return False
        if op.type.named_extents != extents:
            return False
        depends.update(op.results)
    return value in depends
