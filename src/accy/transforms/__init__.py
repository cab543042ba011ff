"""Program-to-program transformations: linearize (JVP), pullback (transpose), unroll,
simplify, retype. `accy.gradient` composes them into grad and friends."""

from . import linearize, pullback, retype, simplify, unroll
from .linearize import Dual, Linearized
from .pullback import Pullback, VjpContext

__all__ = [
    "Dual",
    "Linearized",
    "Pullback",
    "VjpContext",
    "linearize",
    "pullback",
    "retype",
    "simplify",
    "unroll",
]
