"""The logical kernel language: `Program`, the builders its body runs with, and `schedule`.

>>> from accy.kernel.logical import Program, schedule
>>> schedule.thread_blocks(x=4).x
4
"""

from ..ir import RESULT, Launch
from . import schedule
from .params import Args, Param
from .program import Program
from .scope import Scope
from .values import Value

__all__ = ["RESULT", "Args", "Launch", "Param", "Program", "Scope", "Value", "schedule"]
