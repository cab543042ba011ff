"""The Python-first front end: named arrays, and function transforms over trees of them.

`NamedArray` (`named`) holds concrete data with axis names and runs operations eagerly;
`jit`, `grad`, `value_and_grad`, `jvp`, `vjp`, `linearize` and `vmap` transform Python
functions over trees (dicts, lists, tuples, named tuples, dataclasses) of named arrays. All of
it is built on Programs: each transform traces the function into one and reuses the
Program-level transforms of `accy.gradient` and `accy.transforms`.
"""

from .errors import DeviceMismatch, NonArrayLeaf, StaticArgumentError, TransformError
from .functions import grad, jit, jvp, linearize, value_and_grad, vjp
from .named import NamedArray, named
from .vmap import vmap

__all__ = [
    "DeviceMismatch",
    "NamedArray",
    "NonArrayLeaf",
    "StaticArgumentError",
    "TransformError",
    "grad",
    "jit",
    "jvp",
    "linearize",
    "named",
    "value_and_grad",
    "vjp",
    "vmap",
]
