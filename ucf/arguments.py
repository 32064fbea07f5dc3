"""Whether a public function's arguments are of the types its annotations say.

``ucf.errors.boundary`` asks once something other than a ``UcfError`` escaped a
public function: if an argument is of a type its annotation does not admit
(``ucf.compile(stmt, formats="csr")``), that is the user's mistake, said as an
``ArgumentError`` naming the parameter and what it takes, not a bug of ucf's. A
call that works pays nothing for the check.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from ucf.errors import public_name

#: What a parameter takes, said more exactly than its annotation can.
_TAKES = {
    "formats": "a dict of formats by tensor name, as in formats={'A': 'csr'}",
    "shapes": "a dict by index variable or tensor name, as in shapes={'j': 8}",
    "static": "a dict of operands by tensor name, as in static={'W': w}",
    "dynamic": "a dict of micro-tile shapes by operand, as in dynamic={'A': (32, 1)}",
    "attrs": "a dict of ucf.TeSA by tensor name",
    "masks": "a dict of masks by operand, as in masks={'A': m}",
}


def misfit(fn: Callable, signature: inspect.Signature, bound: dict) -> str | None:
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
            return f"{public_name(fn)}: {name}= takes {takes}, got {type(value).__name__} {shown}"
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
