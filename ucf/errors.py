"""The single error hierarchy of ucf.

Every failure a user can cause derives from :class:`UcfError`, so callers can
catch one type and the CLI can print one line without a traceback.
"""

from __future__ import annotations


class UcfError(Exception):
    """Base class of every error ucf raises on bad input."""


class ParseError(UcfError):
    """Einsum or schedule text that does not parse; carries line, column and a caret."""

    def __init__(self, message: str, text: str = "", line: int = 0, column: int = 0):
        self.line = line
        self.column = column
        self.text = text
        if text and line:
            src = text.splitlines()[line - 1] if line - 1 < len(text.splitlines()) else ""
            caret = " " * max(column - 1, 0) + "^"
            message = f"{message} at line {line}, column {column}:\n  {src}\n  {caret}"
        super().__init__(message)


class FormatError(UcfError):
    """A bad format string or storage that violates its format's invariants."""


class ShapeError(UcfError):
    """Inconsistent extents: an index variable bound to two sizes, wrong arity."""


class OperandError(UcfError):
    """A missing, unknown or unusable operand (including unusable dtypes)."""


class ScheduleError(UcfError):
    """A schedule whose preconditions do not hold."""


class UnsupportedError(UcfError):
    """A well-formed request that this version of ucf cannot compile yet."""


class CompileError(UcfError):
    """The backend compiler (cc, llvm, nvcc) rejected generated code."""
