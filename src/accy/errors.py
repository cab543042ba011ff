"""One family of errors: every user mistake accy detects is an `AccyError`.

Messages say what was wrong, where (the operation and, while tracing, the user's source line),
and what would be right. Each subclass exists so that callers can catch a specific failure by
type.
"""

from __future__ import annotations

import os
import sys
from typing import Any

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class AccyError(Exception):
    """Base class of every error accy raises for bad input."""


class TypeRuleError(AccyError):
    """An operation was given operands or attributes its type rule rejects."""


class AxisError(TypeRuleError):
    """A named axis is missing, duplicated, or has a mismatched extent."""


class DTypeError(TypeRuleError):
    """Operands of different dtypes met, or a dtype is not allowed here."""


class ParseError(AccyError):
    """The program text could not be read; the message gives line and column."""

    def __init__(self, message: str, line: int, column: int):
        super().__init__(f"line {line}, column {column}: {message}")
        self.line = line
        self.column = column


class GradientRequiresScalarOutput(AccyError):
    """`grad` needs a program with exactly one output of rank 0."""


class CustomCallRequiresJvpContract(AccyError):
    """A custom call was differentiated in forward mode without a JVP rule for its target."""


class CustomCallRequiresVjpContract(AccyError):
    """A custom call was transposed without a VJP rule for its target."""


class CustomCallError(AccyError):
    """An `accy.CustomCall` was declared with a bad field, or cannot do what was asked of it."""


class CustomCallConflict(CustomCallError):
    """A custom call's (target, version) was registered again with a different definition."""


class NotDifferentiable(AccyError):
    """The requested derivative does not exist (integer inputs, a wrt index out of range, ...)."""


class MeshError(AccyError):
    """A device mesh, an axis mapping or a sharding does not fit (an unknown mesh axis, an extent
    the devices cannot split evenly, a collective over a mesh axis the mesh lacks)."""


class InvalidInput(AccyError):
    """A buffer or array given to an executor does not fit the program's parameter."""


class DonationError(InvalidInput):
    """A donated argument that cannot be overwritten: not a writable NumPy array that owns its
    memory, of exactly the parameter's dtype and extents, or a donation a device cannot honour."""


class RuntimeUnavailable(AccyError):
    """A runtime (C compiler, CUDA driver or device) that was asked for is not present."""


class CompileError(AccyError):
    """Generated code failed to compile: this is a bug in accy, reported with the source path."""


class ConfigurationError(AccyError):
    """An environment variable accy reads (such as `ACCY_CACHE_MAX_BYTES`) has an unusable value."""


class PretrainedError(AccyError):
    """A Hugging Face model folder (config.json, safetensors files) is missing, unreadable, or
    does not match the model that reads it."""


class AccyWarning(UserWarning):
    """Base class of the warnings accy gives: it worked, but not in the way that was asked."""


class CacheWarning(AccyWarning):
    """The compile cache folder could not be used; built libraries went to a private folder."""


_DEMOS_DIR = os.path.join(_PACKAGE_DIR, "demo")
_IS_ACCYS: dict[str, bool] = {}  # file name -> whether it is accy's


def is_accys_code(code: Any) -> bool:
    """Whether the code object `code` is accy's own, which error locations skip to reach the
    user's line. The demos (`accy.demo`) are written as a user writes a model, so their lines
    are the user's. Each file is classified once: tracing asks for every operation (by its
    name, whose hash Python keeps; a code object's is computed at every lookup).

    >>> is_accys_code(is_accys_code.__code__), is_accys_code((lambda: 0).__code__)
    (True, False)
    """
    inside = _IS_ACCYS.get(code.co_filename)
    if inside is None:
        filename = os.path.abspath(code.co_filename)
        inside = filename.startswith(_PACKAGE_DIR + os.sep) and not filename.startswith(
            _DEMOS_DIR + os.sep
        )
        _IS_ACCYS[code.co_filename] = inside
    return inside


def _is_user_frame(frame) -> bool:
    """A frame outside accy, and not hidden (pytest's `__tracebackhide__`, as wrappers set)."""
    return not is_accys_code(frame.f_code) and not frame.f_locals.get("__tracebackhide__", False)


def attach_user_location(error: BaseException) -> None:
    """Append the innermost user frame of `error`'s traceback (outside accy) to its message.

    When the traceback has no user frame (accy raised it after the user's code returned, as for
    a bad output), the innermost user frame of the calling stack is used instead.
    """
    location = ""
    tb = error.__traceback__
    while tb is not None:
        if _is_user_frame(tb.tb_frame):
            location = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    if not location:
        frame = sys._getframe(1)
        while frame is not None and not _is_user_frame(frame):
            frame = frame.f_back
        if frame is not None:
            location = f"{frame.f_code.co_filename}:{frame.f_lineno}"
    if location and error.args and "(traced at " not in str(error.args[0]):
        error.args = (f"{error.args[0]}\n  (traced at {location})", *error.args[1:])


class CheckpointError(AccyError):
    """A checkpoint could not be written, or a file is not the checkpoint `accy.load` was
    asked for (not safetensors, damaged, or another tree: the message names the key)."""
