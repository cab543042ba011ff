"""The closed set of operation kinds. Importing this package fills `RULES`.

| family      | kinds                                                            |
| ----------- | ---------------------------------------------------------------- |
| creation    | parameter, constant, iota                                        |
| elementwise | unary, add, sub, mul, div, pow, max, min, compare, select, convert |
|             | atan2, rem, copysign, and, or, xor, shift_left,                  |
|             | shift_right_logical, shift_right_arithmetic, bitcast_convert     |
| layout      | broadcast_in_dim, transpose, reshape, slice, pad, concatenate    |
| reduction   | reduce                                                           |
| contraction | dot_general, conv                                                |
| pooling     | reduce_window, select_and_gather_add, select_and_scatter_add     |
| indexing    | gather, scatter_add, scatter                                     |
| sorting     | sort                                                             |
| control     | custom_call, scan, cond, while_loop                              |
| collectives | psum, all_gather, reduce_scatter, all_to_all, ppermute, axis_index |
"""

from . import (
    collectives,
    contraction,
    control,
    convolution,
    creation,
    elementwise,
    indexing,
    layout,
    pooling,
    reduction,
    sorting,
)
from .registry import RULES, Linear, Rule, Zero, rule_for

__all__ = [
    "RULES",
    "Linear",
    "Rule",
    "Zero",
    "collectives",
    "contraction",
    "convolution",
    "control",
    "creation",
    "elementwise",
    "indexing",
    "layout",
    "pooling",
    "reduction",
    "rule_for",
    "sorting",
]
