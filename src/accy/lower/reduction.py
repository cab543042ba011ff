"""Loop order of a `reduce`: how its input is walked and where partial results accumulate.

- `rows`: the innermost (non-unit) input axis is reduced, or everything is. Each result element
  is one accumulator, kept in a register, that an inner loop over the reduced axes updates: the
  loads are contiguous and the inner loop is a vectorizable reduction.
- `columns`: the innermost axis is kept (summing a `[row, embed]` tensor over `row`). The input
  is walked in its own layout and every element is combined into its result element, which sits
  in memory; the inner loop is then elementwise over the kept axis and vectorizes as such.
  Results of a 16-bit float dtype accumulate in a float32 scratch array and are rounded once.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core import Operation
from ..core.types import HALF_FLOATS, TensorType


@dataclass(frozen=True)
class ReduceLayout:
    """Positions (in the input's layout) of the kept and reduced axes, and the loop order."""

    input: TensorType
    kept: tuple[int, ...]
    reduced: tuple[int, ...]
    strategy: str

    @property
    def needs_accumulator(self) -> bool:
        """Whether partial results need a float32 scratch array (see the module docstring)."""
        return self.strategy == "columns" and self.input.dtype in HALF_FLOATS


def reduce_layout(op: Operation) -> ReduceLayout:
    """The loop order of a `reduce` operation (see the module docstring).

    >>> import accy
    >>> p = accy.trace.define("s", [accy.spec(accy.f32, row=4, col=8)],
    ...                       lambda b, a: (a[0].sum("col"), a[0].sum("row")))
    >>> [reduce_layout(op).strategy for op in p.operations if op.kind == "reduce"]
    ['rows', 'columns']
    """
    x = op.operand_types[0]
    reduced = tuple(x.position(a) for a in op.attrs["axes"])
    kept = tuple(p for p in range(x.rank) if p not in reduced)
    significant = [p for p in range(x.rank) if x.extents[p] != 1]
    innermost_kept = bool(significant) and significant[-1] in kept and bool(reduced)
    return ReduceLayout(x, kept, tuple(sorted(reduced)), "columns" if innermost_kept else "rows")
