"""Schedule text (``grammar/schedule.lark``) parsed into commands."""

from __future__ import annotations

from ucf.errors import ParseError
from ucf.schedule.commands import Command, command


def parse_schedule(text: str) -> list[Command]:
    """The commands of ``text``, each of its own class with its arguments checked.
    (lark is imported here: a kernel loaded from the cache parses nothing.)"""
    import lark

    from ucf.lang.parser import _describe, _parser

    try:
        tree = _parser("schedule.lark").parse(text)
    except lark.exceptions.UnexpectedInput as e:
        raise ParseError("schedule: " + _describe(e), text, e.line, e.column) from None
    return [
        command(str(node.children[0]), tuple(_text(text, a) for a in node.children[1:] if a))
        for node in tree.children
        if node is not None
    ]


def _text(source: str, node) -> str:
    import lark

    if isinstance(node, lark.Token):
        return str(node)
    meta = node.meta
    return source[meta.start_pos : meta.end_pos]
