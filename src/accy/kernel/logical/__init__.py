"""The logical kernel language: `Program`, its builders, and `schedule`.

>>> from accy.kernel.logical import Program, schedule
>>> schedule.thread_blocks(x=4).x
4
"""

from . import schedule
from .program import RESULT, Args, Launch, Param, Program, Scope, Value

__all__ = ["RESULT", "Args", "Launch", "Param", "Program", "Scope", "Value", "schedule"]
