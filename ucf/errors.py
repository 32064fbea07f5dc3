"""The single error hierarchy of ucf.

Every failure a user can cause derives from :class:`UcfError`, so callers can
catch one type and the CLI can print one line without a traceback. A public
function's argument of a type its annotation does not admit (``formats="csr"``) is
the user's mistake, said as an ``ArgumentError`` naming the parameter: checked only
once something escaped, so a call that works pays nothing for it.
"""

from __future__ import annotations

import functools
import inspect
import sys
import warnings
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


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


class MissingDependencyError(UcfError, ImportError):
    """An optional dependency (torch, pycuda, ...) that a requested feature needs is not
    installed; the message gives the pip command that brings it."""


class DLPackError(FormatError, BufferError):
    """A tensor that cannot be shared through DLPack (only dense storage can). Also a
    ``BufferError``, which is what the DLPack protocol says exporters raise."""


class ProgramError(UcfError):
    """A program of statements that is not a data-flow graph in SSA form: a tensor
    defined twice, read before its definition, read without a definition or a shape,
    or named as an output or given an attribute without being part of the program."""


class CompileError(UcfError):
    """The backend compiler (cc, llvm, nvcc) rejected generated code."""


class ArgumentError(UcfError, TypeError):
    """A public function called with arguments its signature does not take (an unknown
    keyword, a missing or extra argument). Also a ``TypeError``, as Python raises."""


class InternalError(UcfError):
    """A bug in ucf: something other than a ``UcfError`` escaped from the public API.

    The message carries what a bug report needs (the statement, formats,
    schedule, target and ucf's version); the original exception is chained
    as ``__cause__``.
    """


#: Exceptions that cross the API boundary unchanged: ucf's own, resource
#: exhaustion (not a bug), and warnings turned into errors by the user's filters.
_PASSED = (UcfError, MemoryError, Warning)
#: The arguments and attributes that describe a call in a bug report.
_CONTEXT = ("expr", "statement", "formats", "format", "schedule", "target", "dtype", "path")


def boundary(fn: Callable[P, R]) -> Callable[P, R]:
    """Mark ``fn`` as part of the public API: any exception escaping it that is not
    a ``UcfError`` becomes an ``InternalError`` describing the call."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except ArgumentError as inner:
            # a misfit a function this one calls found: said of the call the user made
            misfit = None
            if getattr(inner, "misfit", False):
                try:
                    bound = signature.bind(*args, **kwargs).arguments
                    misfit = _misfit(fn, signature, bound, args)
                except TypeError:
                    pass
            if misfit is None:
                raise
            raise _misfit_error(misfit) from None
        except _PASSED:
            raise
        except Exception as e:
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as wrong:
                raise ArgumentError(f"{_public_name(fn, args)}: {wrong}") from None
            misfit = _misfit(fn, signature, bound.arguments, args)
            if misfit is not None:
                raise _misfit_error(misfit) from None
            raise InternalError(_report(fn, signature, args, kwargs, e)) from e

    return wrapper


def _misfit_error(message: str) -> ArgumentError:
    """An ArgumentError for an argument its annotation does not admit, marked so that
    an enclosing public function says it of its own argument instead."""
    e = ArgumentError(message)
    e.misfit = True
    return e


#: What a parameter takes, said more exactly than its annotation can.
_TAKES = {
    "formats": "a dict of formats by tensor name, as in formats={'A': 'csr'}",
    "shapes": "a dict by index variable or tensor name, as in shapes={'j': 8}",
    "static": "a dict of operands by tensor name, as in static={'W': w}",
    "dynamic": "a dict of micro-tile shapes by operand, as in dynamic={'A': (32, 1)}",
    "attrs": "a dict of ucf.TeSA by tensor name",
    "masks": "a dict of masks by operand, as in masks={'A': m}",
}


def _misfit(fn: Callable, signature: inspect.Signature, bound: dict, args: tuple) -> str | None:
    """Why the call went wrong when one of its arguments is of a type its annotation
    does not admit (``formats='csr'``): checked only once something escaped, so a call
    that works pays nothing for it."""
    hints = _hints(fn)
    for name, value in bound.items():
        param = signature.parameters[name]
        hint = hints.get(name)
        if hint is None or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if not _admits(hint, value):
            takes = _TAKES.get(name) or _described(hint)
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            got = f"{type(value).__name__} {shown}"
            return f"{_public_name(fn, args)}: {name}= takes {takes}, got {got}"
    return None


def _hints(fn: Callable) -> dict[str, object]:
    """``fn``'s parameter annotations as objects, each evaluated alone: one that names
    what only a type checker imports is left out."""
    import typing  # noqa: F401  (names annotations may use)

    found = {}
    for name, text in getattr(fn, "__annotations__", {}).items():
        if not isinstance(text, str):
            found[name] = text
            continue
        try:
            found[name] = eval(text, fn.__globals__)  # noqa: S307 (ucf's own annotations)
        except Exception:
            continue
    return found


def _admits(hint: object, value: object) -> bool:
    """Whether ``value`` may be passed where ``hint`` is annotated; lenient wherever the
    annotation is (numpy numbers for int and float, any mapping for a dict, any
    sequence but a string for a list or tuple)."""
    import numbers
    import types
    import typing
    from collections.abc import Mapping, Sequence

    if hint is typing.Any or isinstance(hint, typing.TypeVar):
        return True
    if hint is None or hint is type(None):
        return value is None
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_admits(h, value) for h in typing.get_args(hint))
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    cls = origin if origin is not None else hint
    if cls is bool:
        return isinstance(value, bool) or type(value).__name__ == "bool_"
    if cls is int:
        return isinstance(value, numbers.Integral)
    if cls is float:
        return isinstance(value, numbers.Real)
    if cls is str:
        return isinstance(value, str)
    if cls is dict:
        return isinstance(value, Mapping)
    if cls in (list, tuple):
        return isinstance(value, Sequence) and not isinstance(value, str | bytes)
    if isinstance(cls, type):
        return isinstance(value, cls)
    return True


def _described(hint: object) -> str:
    """An annotation in words: ``str | None`` is "a str or None"."""
    import types
    import typing

    if hint is None or hint is type(None):
        return "None"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_described(h) for h in typing.get_args(hint))
    cls = origin if origin is not None else hint
    name = getattr(cls, "__name__", str(cls))
    return f"an {name}" if name[:1] in "aeiouAEIOU" else f"a {name}"


def _public_name(fn: Callable, args: tuple = ()) -> str:
    """``ucf.compile``, ``Kernel.__call__``: the name a user called (a method by the class
    of the object it was called on, which may have it from a part: ``Kernel`` its
    ``__call__`` from ``Calling``)."""
    qualname = fn.__qualname__
    if "." not in qualname:
        return f"ucf.{qualname}"
    owner = args[0] if args else None
    method = getattr(type(owner), fn.__name__, None) if owner is not None else None
    if getattr(method, "__wrapped__", None) is fn:
        return f"{type(owner).__name__}.{fn.__name__}"
    return qualname


def _report(fn, signature, args, kwargs, error: Exception) -> str:
    from ucf._version import __version__

    try:
        bound = signature.bind_partial(*args, **kwargs).arguments
    except TypeError:
        bound = {}
    context = {k: bound[k] for k in _CONTEXT if bound.get(k) is not None}
    owner = bound.get("self")
    for name in _CONTEXT:
        value = getattr(owner, name, None) if owner is not None else None
        if value is not None and name not in context and not callable(value):
            context[name] = value
    described = "; ".join(
        f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in context.items()
    )
    return (
        f"internal error in ucf {__version__} ({_public_name(fn, args)}: {type(error).__name__}: "
        f"{error}); this is a bug in ucf, please file it with this message"
        + (f" [{described}]" if described else "")
    )


class CacheWarning(UserWarning):
    """A cache entry could not be used (damaged, truncated or another kernel's), or the
    cache directory could not be made; ucf recompiles, or caches elsewhere."""


class ConversionWarning(UserWarning):
    """An operand is converted (format, value or index dtype) before a kernel reads it:
    a cost on every call that converting it once, beforehand, avoids."""


_PACKAGE = __file__.rsplit("/", 1)[0]


def warn_user(message: str, category: type[Warning]) -> None:
    """Warn with the location of the first caller outside ucf, so the warning points
    at the user's line whatever depth of ucf lies between."""
    frame = sys._getframe(1)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
        level += 1
    warnings.warn(message, category, stacklevel=level)
