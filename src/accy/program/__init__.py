"""The Program IR: immutable records, a printer and a parser for its text form."""

from .ir import SYNTHETIC_ID, Attrs, Operation, Program
from .text import format_program, parse

__all__ = ["SYNTHETIC_ID", "Attrs", "Operation", "Program", "format_program", "parse"]
