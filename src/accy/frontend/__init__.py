"""The Python-first front end: named arrays, and function transforms over trees of them.

`NamedArray` (`named`) holds concrete data with axis names and runs operations eagerly;
`jit`, `grad`, `value_and_grad`, `jvp`, `vjp`, `linearize` and `vmap` transform Python
functions over trees (dicts, lists, tuples, named tuples, dataclasses) of named arrays, and
`scan`, `cond`, `switch`, `while_loop`, `fori_loop` and `map` loop and branch over such trees,
eagerly or inside those transforms. All of it is built on Programs: each transform traces the
function into one and reuses the Program-level transforms of `accy.gradient` and
`accy.transforms`.
"""

from .control import cond, fori_loop, map, scan, switch, while_loop  # noqa: A004
from .errors import DeviceMismatch, NonArrayLeaf, StaticArgumentError, TransformError
from .functions import disable_jit, grad, jit, jvp, linearize, value_and_grad, vjp
from .named import NamedArray, named
from .vmap import vmap

__all__ = [
    "DeviceMismatch",
    "NamedArray",
    "NonArrayLeaf",
    "StaticArgumentError",
    "TransformError",
    "disable_jit",
    "cond",
    "fori_loop",
    "grad",
    "jit",
    "jvp",
    "linearize",
    "map",
    "named",
    "scan",
    "switch",
    "value_and_grad",
    "vjp",
    "vmap",
    "while_loop",
]
