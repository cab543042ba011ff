"""Which windowed reductions the CPU runs whole, and the geometry its one-pass loops walk.

The kinds of `core/kinds/pooling.py` (`reduce_window`, `select_and_gather_add`,
`select_and_scatter_add`) are kept in their operands' own layouts (nothing is transposed).
Their loops see the input as *rows* (every axis up to the last window axis) of one contiguous
*run* (the axes after it: the channels of an NHWC image), and each result row as that many
lanes: for every window offset, in row-major order of the window axes, a row of the input is
combined into the row's lanes (a vector loop over the channels), so every element is read once
per window that holds it and nothing is gathered.

Declined (composed, `core/windows.py`): every windowed kind with `accy.config.cpu_pool` off
(`ACCY_CPU_POOL=0`), an empty operand, sizes past 32-bit indices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import config
from ..core import Operation
from ..core.kinds.pooling import WINDOW_KINDS
from ..core.types import HALF_FLOATS

LANES = 128  # lanes of a row combined at once: the accumulators stay in L1


@dataclass(frozen=True)
class PoolGeometry:
    """One windowed kind as the CPU's loops see it: the input's `extents` (its leading axes,
    up to the last window axis) over rows of `run` elements, the result's `positions` along
    the same axes, and per leading axis its window attributes (`window[i]` 0: not a window
    axis). `order`: the leading axes that are window axes, in the order their offsets nest."""

    kind: str
    op: str
    dtype: str
    extents: tuple[int, ...]
    positions: tuple[int, ...]
    run: int
    window: tuple[int, ...]
    stride: tuple[int, ...]
    low: tuple[int, ...]
    dilation: tuple[int, ...]
    order: tuple[int, ...]

    @property
    def lanes(self) -> int:
        """Lanes combined at once (a block of the run)."""
        return min(self.run, LANES)

    @property
    def work(self) -> int:
        """Element reads: every result element's window."""
        windows = math.prod(self.window[i] for i in self.order)
        return math.prod(self.positions) * self.run * windows

    @property
    def shared_outer(self) -> bool:
        """Whether the outermost leading axis is a window axis: a scatter's windows along it
        overlap, so its iterations may not run on different threads."""
        return self.window[0] > 0


def pool_orders(op: Operation) -> tuple[tuple[str, ...], ...] | None:
    """The CPU target's `keep` for the windowed kinds: their operands' own layouts, or None
    where it declines (then the kind is composed).

    >>> import accy
    >>> p = accy.trace.define("m", [accy.spec(accy.f32, h=4, c=2)],
    ...                       lambda b, a: accy.nn.max_pool(a[0], {"h": 3}, 1))
    >>> pool_orders(p.operations[-1])
    (('h', 'c'),)
    """
    if op.kind not in WINDOW_KINDS or not config.cpu_pool:
        return None
    types = (*op.operand_types, op.type)
    if any(t.size == 0 or t.size >= 1 << 31 for t in types):
        return None
    return tuple(t.axes for t in op.operand_types)


def pool_geometry(op: Operation) -> PoolGeometry:
    """The geometry of a windowed kind the CPU kept.

    >>> import accy
    >>> p = accy.trace.define("m", [accy.spec(accy.f32, n=2, h=5, w=5, c=3)],
    ...                       lambda b, a: accy.nn.max_pool(a[0], {"h": 3, "w": 3}, 2))
    >>> g = pool_geometry(p.operations[-1])
    >>> g.extents, g.positions, g.run, g.window, g.order
    ((2, 5, 5), (2, 2, 2), 3, (0, 3, 3), (1, 2))
    """
    x = op.operand_types[-1]
    reduced = op.type if op.kind != "select_and_scatter_add" else op.operand_types[0]
    attrs = op.attrs
    axes = attrs["axes"]
    lead = 1 + max(x.position(a) for a in axes)
    per = {
        n: dict(zip(axes, attrs[n], strict=True)) for n in ("window", "stride", "low", "dilation")
    }
    leading = x.axes[:lead]
    return PoolGeometry(
        kind=op.kind,
        op=attrs["op"],
        dtype=x.dtype.name,
        extents=x.extents[:lead],
        positions=reduced.extents[:lead],
        run=math.prod(x.extents[lead:]),
        window=tuple(per["window"].get(a, 0) for a in leading),
        stride=tuple(per["stride"].get(a, 1) for a in leading),
        low=tuple(per["low"].get(a, 0) for a in leading),
        dilation=tuple(per["dilation"].get(a, 1) for a in leading),
        order=tuple(x.position(a) for a in axes),
    )


def needs_accumulator(op: Operation) -> bool:
    """Whether a kept windowed kind adds into an f32 accumulator (a 16-bit float scatter: each
    element's sum rounded once, as the kind's reference).

    >>> import accy
    >>> p = accy.trace.define("m", [accy.spec(accy.bf16, h=4)],
    ...                       lambda b, a: accy.nn.max_pool(a[0], {"h": 2}, 1).sum())
    >>> [needs_accumulator(op) for op in accy.grad(p).operations if op.operands]
    [True]
    """
    return op.kind == "select_and_scatter_add" and op.type.dtype in HALF_FLOATS
