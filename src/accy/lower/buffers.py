"""Buffer planning: place stored intermediates in one workspace so that memory is reused.

Each intermediate is live from the step that writes it to the last step that reads it. Walking
the steps in order, a step's results (and its scratch) are placed first and only then are the
buffers whose last reader it is released, so a step never writes over its own inputs. Placement
is best fit in a free list of aligned blocks; the workspace is as large as the highest block end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALIGNMENT = 64  # bytes: a cache line, and the widest vector load (AVX-512)


def aligned(size: int) -> int:
    """`size` rounded up to whole alignment units (at least one unit).

    >>> aligned(1), aligned(64), aligned(65)
    (64, 64, 128)
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
    (True, 128)
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
